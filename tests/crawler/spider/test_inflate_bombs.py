"""Issue 29: every inflated body is bounded, robots.txt and tdmrep.json included.

Four hosts serve a few KB that inflate to 1 GiB of zero bytes: brotli (1,617 bytes) and gzip
of gzip as robots.txt, zstd and gzip as tdmrep.json. The crawl runs in a subprocess whose peak
RSS is read from the kernel: on main it grew past 1.2 GB on the brotli host alone.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
import threading

import pytest

from lait.testkit.generator import Response
from lait.workdir import WorkDir

HTML = "text/html; charset=utf-8"
JPEG = b"\xff\xd8\xff\xe0" + b"\0" * 64
GIB = 1 << 30
MIB = 1 << 20
RSS_LIMIT_KIB = 512 * 1024


def brotli_bomb() -> bytes:
    import brotli

    c = brotli.Compressor(quality=5)
    zeros = bytes(MIB)
    return b"".join([c.process(zeros) for _ in range(GIB // MIB)] + [c.finish()])


def gzip_gzip_bomb() -> bytes:
    """1 GiB of zeros as 1,024 gzip members of 1 MiB each (1 MiB), gzipped again (2.6 KB)."""
    return gzip.compress(gzip.compress(bytes(MIB), 9) * (GIB // MIB), 9)


def zstd_bomb() -> bytes:
    try:
        from backports import zstd
    except ImportError:  # Python 3.14 has it in the standard library
        from compression import zstd  # type: ignore[no-redef]
    c = zstd.ZstdCompressor()
    zeros = bytes(MIB)
    return b"".join([c.compress(zeros) for _ in range(GIB // MIB)] + [c.flush()])


class _BombHost:
    """A small site whose robots.txt or tdmrep.json is a bomb with `encoding`."""

    def __init__(self, doc: str, body: bytes, encoding: str):
        self.doc, self.body, self.encoding = doc, body, encoding
        self.hits: list[str] = []
        self._lock = threading.Lock()

    def route(self, path, base_url=""):
        with self._lock:
            self.hits.append(path)
        if path == self.doc:  # served whatever Accept-Encoding asked for, as a hostile host does
            return Response(200, "text/plain", self.body, {"Content-Encoding": self.encoding})
        if path == "/robots.txt":
            return Response(200, "text/plain", b"User-agent: *\nAllow: /\n")
        if path == "/":
            return Response(200, HTML, b'<html><body><a href="/a.html">a</a>'
                                       b'<img src="/pic.jpg" alt="a photo"></body></html>')
        if path == "/a.html":
            return Response(200, HTML, b"<html><body><p>a page</p></body></html>")
        if path == "/pic.jpg":
            return Response(200, "image/jpeg", JPEG)
        return Response(404, "text/plain", b"")


# A small launcher runs the command and reports its children's peak RSS (KiB on Linux): a child
# forked straight from pytest would count pytest's own memory at the fork, before its exec.
MEASURE = ("import resource, subprocess, sys\n"
           "rc = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
           "sys.exit(rc)\n")


def run_measured(cmd: list[str], env: dict) -> tuple[int, int, bytes]:
    """Exit status, peak RSS in KiB of the command and every process it waited for, stderr."""
    done = subprocess.run([sys.executable, "-c", MEASURE, *cmd], env=env, capture_output=True, timeout=600)
    return done.returncode, int(done.stdout.split()[-1]), done.stderr


@pytest.fixture(scope="module")
def bombed(tmp_path_factory, helpers):
    from lait.testkit.server import SiteServer

    hosts = {"robots_br": _BombHost("/robots.txt", brotli_bomb(), "br"),
             "robots_gzip": _BombHost("/robots.txt", gzip_gzip_bomb(), "gzip, gzip"),
             "tdmrep_zstd": _BombHost("/.well-known/tdmrep.json", zstd_bomb(), "zstd"),
             "tdmrep_gzip": _BombHost("/.well-known/tdmrep.json", gzip_gzip_bomb(), "gzip, gzip")}
    assert all(len(h.body) < 40 * 1024 for h in hosts.values())
    tmp = tmp_path_factory.mktemp("bombs")
    servers = {k: SiteServer(h).start() for k, h in hosts.items()}
    try:
        cfg = helpers.crawl_config(tmp / "w", [s.url + "/" for s in servers.values()], retries=0,
                                   same_site=True, download_timeout=20.0)
        config = helpers.config_file(cfg, tmp / "crawl.yaml")
        rc, maxrss, stderr = run_measured(helpers.crawler_cmd(config, tmp / "stats.json"), helpers.crawler_env())
    finally:
        for s in servers.values():
            s.close()
    urls = {k: s.url for k, s in servers.items()}
    return WorkDir(tmp / "w"), urls, rc, maxrss, helpers.read_stats(tmp / "stats.json"), stderr


def test_the_crawl_finishes_within_512_mib(bombed):
    _, _, rc, maxrss_kib, stats, stderr = bombed
    assert rc == 0, stderr.decode(errors="replace")[-3000:]
    assert stats["finish_reason"] == "finished"
    assert maxrss_kib < RSS_LIMIT_KIB, f"peak RSS {maxrss_kib // 1024} MiB"


def test_each_bomb_is_a_row_with_its_reason(bombed):
    work, urls, *_ = bombed
    rows = work.read("rejected").to_pylist()
    bombs = {r["page_url"] for r in rows if r["reason"] == "crawl/decompression_bomb"}
    assert bombs == {urls["robots_br"] + "/robots.txt", urls["robots_gzip"] + "/robots.txt",
                     urls["tdmrep_zstd"] + "/.well-known/tdmrep.json",
                     urls["tdmrep_gzip"] + "/.well-known/tdmrep.json"}


@pytest.mark.parametrize("host", ["robots_br", "robots_gzip"])
def test_a_robots_bomb_disallows_its_host(bombed, host):
    """RFC 9309: a robots.txt that cannot be read disallows all; each refused request is a row."""
    work, urls, *_ = bombed
    base = urls[host]
    pages = {r["url"] for r in work.read("pages").to_pylist()}
    assert not any(u.startswith(base) for u in pages)
    refused = {r["page_url"] for r in work.read("rejected").to_pylist() if r["reason"] == "crawl/robots_unreachable"}
    assert base + "/" in refused
    detail = [r["detail"] for r in work.read("rejected").to_pylist() if r["page_url"] == base + "/"]
    assert "decompression bomb" in detail[0]


@pytest.mark.parametrize("host", ["tdmrep_zstd", "tdmrep_gzip"])
def test_a_tdmrep_bomb_reserves_nothing(bombed, host):
    work, urls, *_ = bombed
    base = urls[host]
    pages = {r["url"]: r for r in work.read("pages").to_pylist()}
    assert pages[base + "/"]["html"] and pages[base + "/a.html"]["html"]
    images = {r["image_url"]: r for r in work.read("images").to_pylist()}
    assert images[base + "/pic.jpg"]["error"] is None


def test_lait_download_is_bounded_the_same(tmp_path, helpers):
    """`lait download` fetches with the crawl's fetcher: a list's images on a host whose
    robots.txt is a bomb are refused with a row, those on a host whose tdmrep.json is one are
    fetched, and no process of the download grows past 512 MiB."""
    from lait.testkit.server import SiteServer

    robots, tdmrep = _BombHost("/robots.txt", brotli_bomb(), "br"), \
        _BombHost("/.well-known/tdmrep.json", gzip_gzip_bomb(), "gzip, gzip")
    with SiteServer(robots) as a, SiteServer(tdmrep) as b:
        (tmp_path / "list.csv").write_text(f"url,caption\n{a.url}/pic.jpg,one\n{b.url}/pic.jpg,two\n")
        cmd = [sys.executable, "-m", "lait", "download", str(tmp_path / "list.csv"), "--out",
               str(tmp_path / "w"), "--allow-loopback", "--processes", "1", "--retries", "0",
               "--no-progress", "--log-level", "WARNING"]
        rc, maxrss, stderr = run_measured(cmd, helpers.crawler_env())  # it and its fetcher process
    assert rc == 0, stderr.decode(errors="replace")[-3000:]
    assert maxrss < RSS_LIMIT_KIB, f"peak RSS {maxrss // 1024} MiB"
    work = WorkDir(tmp_path / "w")
    rejected = {(r["reason"], r["image_url"] or r["page_url"]) for r in work.read("rejected").to_pylist()}
    assert ("crawl/decompression_bomb", a.url + "/robots.txt") in rejected
    assert ("crawl/decompression_bomb", b.url + "/.well-known/tdmrep.json") in rejected
    assert ("crawl/robots_unreachable", a.url + "/pic.jpg") in rejected
    images = {r["image_url"]: r for r in work.read("images").to_pylist()}
    assert images[b.url + "/pic.jpg"]["error"] is None
