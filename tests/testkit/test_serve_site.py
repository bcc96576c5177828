"""`lait serve-site` as a user runs it: a subprocess printing its URL, then serving."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from lait.app import site as command


@pytest.fixture
def serve(tmp_path):
    procs = []

    def start(*extra: str) -> str:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lait.app.cli", "serve-site", "--port", "0", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        line = proc.stdout.readline().strip()
        if not line.startswith("http://127.0.0.1:"):
            proc.kill()
            pytest.fail(f"no URL printed: {line!r} {proc.stderr.read()}")
        return line

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


def test_register_adds_documented_options():
    parser = argparse.ArgumentParser(prog="lait")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["-v", "serve-site", "--pages", "7", "--port", "0"])
    cfg = command.ServeSiteConfig.from_args(args)
    assert cfg.pages == 7 and cfg.port == 0 and cfg.log_requests is False
    assert args.verbose == 1  # no clash with `lait -v`
    defaults = command.ServeSiteConfig.from_args(parser.parse_args(["serve-site"]))
    assert (defaults.pages, defaults.host, defaults.port) == (200, "127.0.0.1", 8000)


def test_serve_site_subprocess(serve, tmp_path):
    truth_path = tmp_path / "truth.json"
    url = serve("--pages", "30", "--seed", "4", "--ground-truth", str(truth_path))
    truth = json.loads(truth_path.read_text())
    assert truth["n_pages"] == 30 and truth["seed"] == 4

    robots = urllib.request.urlopen(url + "/robots.txt", timeout=10).read().decode()
    assert "Disallow: /private/" in robots
    page = next(p for p, i in truth["pages"].items() if p.startswith("/articles/"))
    assert b"<article" in urllib.request.urlopen(url + page, timeout=10).read()
    kept = next(u for u, i in truth["images"].items() if i["keep"])
    with urllib.request.urlopen(url + kept, timeout=10) as r:
        assert r.headers["Content-Type"] == "image/jpeg" and len(r.read()) > 1000
    noai = next(u for u, i in truth["images"].items() if i["reason"] == "crawl/noai")
    with urllib.request.urlopen(url + noai, timeout=10) as r:
        assert r.headers["X-Robots-Tag"] == "noai"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url + truth["broken_links"][0], timeout=10)
    assert err.value.code == 404


def test_help_lists_options():
    out = subprocess.run([sys.executable, "-m", "lait.app.cli", "serve-site", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for opt in ("--pages", "--seed", "--host", "--port", "--real-web", "--data-dir",
                "--ground-truth", "--log-requests"):
        assert opt in out.stdout
