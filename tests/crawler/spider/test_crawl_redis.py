"""Acceptance 6: two crawler processes share one crawl through a real redis-server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections import Counter

import pytest

from lait.parts import WorkDir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def redis_url(tmp_path):
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (scripts/system-deps.sh installs it)")
    pytest.importorskip("scrapy_redis")
    import redis

    port = _free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path),
                             "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    try:
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail("redis-server did not start")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_two_processes_share_the_frontier(local_web, redis_url, tmp_path, helpers):
    import redis

    site, base = local_web
    out = tmp_path / "work"
    cfg = helpers.crawl_config(out, [base + "/"], redis_url=redis_url, redis_key="t6",
                               idle_seconds=3.0, per_domain=2,
                               # Slow enough that the crawl outlasts the second process's start-up
                               # (seconds on a loaded machine), so both really share the frontier.
                               scrapy_settings=["DOWNLOAD_DELAY=0.1"])
    config = helpers.config_file(cfg, tmp_path / "crawl.yaml")
    stats_files = [tmp_path / f"stats-{i}.json" for i in range(2)]
    procs = [subprocess.Popen(helpers.crawler_cmd(config, s), env=helpers.crawler_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for s in stats_files]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-3000:]
    stats = [helpers.read_stats(s) for s in stats_files]

    urls = [u[len(base):] for u in WorkDir(out).read("pages", columns=["url"]).column("url").to_pylist()]
    counts = Counter(urls)
    assert [u for u, n in counts.items() if n > 1] == []  # no page fetched twice
    expected = {p for p, t in site.ground_truth()["pages"].items() if not t["disallowed"]}
    assert expected - set(counts) == set()  # together they crawled the whole site
    images = WorkDir(out).read("images", columns=["image_url"]).column("image_url").to_pylist()
    assert len(images) == len(set(images))
    # Both processes did part of the work, and the frontier lived in Redis.
    assert all(s.get("crawl/rows_pages", 0) > 0 for s in stats), [s.get("crawl/rows_pages") for s in stats]
    assert sum(s["crawl/rows_pages"] for s in stats) == len(urls)
    client = redis.Redis.from_url(redis_url)
    assert client.scard("t6:dupefilter") >= len(urls)
