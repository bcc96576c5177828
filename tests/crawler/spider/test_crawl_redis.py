"""Acceptance 6: two crawler processes share one crawl through a real redis-server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections import Counter

import pytest

from lait.workdir import WorkDir


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


def _crawled(out) -> tuple[Counter, Counter, set[str]]:
    """Page URLs and image URLs of a work directory with how often each was written, and the
    URLs of the requests it records as never sent."""
    work = WorkDir(out)
    pages = Counter(work.read("pages", columns=["url"]).column("url").to_pylist())
    images = Counter(work.read("images", columns=["image_url"]).column("image_url").to_pylist())
    refused = {r["image_url"] or r["page_url"] for r in work.read("rejected").to_pylist()
               if r["reason"].startswith("crawl/")}
    return pages, images, refused


@pytest.fixture(scope="module")
def undisturbed(local_web, tmp_path_factory, helpers):
    """What one crawler alone, without Redis, writes of the local web: pages, images, refusals."""
    site, base = local_web
    tmp = tmp_path_factory.mktemp("undisturbed")
    cfg = helpers.crawl_config(tmp / "work", [base + "/"], per_domain=4)
    done = subprocess.run(helpers.crawler_cmd(helpers.config_file(cfg, tmp / "one.yaml")),
                          env=helpers.crawler_env(), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    crawled = _crawled(tmp / "work")
    assert len(crawled[0]) > 30 and len(crawled[1]) > 30
    return crawled


def test_a_crawler_killed_in_a_shared_crawl_loses_nothing(local_web, undisturbed, redis_url, tmp_path, helpers):
    """Issue 59: one of two crawlers sharing a Redis frontier killed with SIGKILL. Its fetched
    rows were in parts it never committed, and the shared filter had marked them seen: 32 of
    110 pages and 68 of 441 images were gone for good. Now the requests it held go back into
    the queue when its lease expires, and the crawl ends as an undisturbed one does: every
    page and image written, each once, and a rerun writes nothing more."""
    import os
    import signal

    import redis

    site, base = local_web
    want_pages, want_images, want_refused = undisturbed

    out = tmp_path / "work"
    cfg = helpers.crawl_config(out, [base + "/"], redis_url=redis_url, redis_key="t59", idle_seconds=3.0,
                               per_domain=2, part_seconds=600.0,  # nothing is committed before the kill
                               scrapy_settings=["DOWNLOAD_DELAY=0.05", "LAIT_REDIS_LEASE_SECONDS=2"])
    config = helpers.config_file(cfg, tmp_path / "crawl.yaml")
    victim, survivor = (subprocess.Popen(helpers.crawler_cmd(config), env=helpers.crawler_env(),
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2))
    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 120
    held = 0
    while time.monotonic() < deadline and victim.poll() is None:
        keys = client.keys(f"t59:held:{victim.pid}-*")
        held = client.hlen(keys[0]) if keys else 0
        if held >= 15:
            break
        time.sleep(0.05)
    assert held >= 15, "the victim never held 15 requests"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)
    victim.stderr.close()
    _, err = survivor.communicate(timeout=300)
    assert survivor.returncode == 0, err.decode()[-3000:]
    assert "went back into the queue" in err.decode()  # the survivor took the victim's requests over

    pages, images, refused = _crawled(out)
    assert [u for u, n in pages.items() if n > 1] == [] and [u for u, n in images.items() if n > 1] == []
    missing = (set(want_pages) - set(pages), set(want_images) - set(images), want_refused ^ refused)
    assert missing == (set(), set(), set()) and set(pages) <= set(want_pages), (missing, err.decode()[-3000:])
    assert client.keys("t59:held:*") == [] and client.keys("t59:alive:*") == []

    rerun = subprocess.run(helpers.crawler_cmd(config), env=helpers.crawler_env(), capture_output=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr.decode()[-3000:]
    assert _crawled(out)[:2] == (pages, images)  # written once, a rerun after it included


def test_a_redis_restart_is_one_warning_and_the_crawl_completes(local_web, undisturbed, tmp_path, helpers):
    """Issue 59: Redis restarted for 6 s in a crawl. The result was complete, but each crawler
    printed about 65 asyncio ConnectionError tracebacks. Now it is one line when Redis goes,
    one when it is back, and the crawl ends as an undisturbed one."""
    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (scripts/system-deps.sh installs it)")
    port = _free_port()
    # Its data kept on disk (append-only file), as a Redis that restarts keeps the frontier.
    server_cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path), "--save", "",
                  "--appendonly", "yes", "--appendfsync", "always"]

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(server_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                redis.Redis(port=port).ping()
                return proc
            except redis.ConnectionError:
                time.sleep(0.05)
        pytest.fail("redis-server did not start")

    server = start()
    site, base = local_web
    out = tmp_path / "work"
    cfg = helpers.crawl_config(out, [base + "/"], redis_url=f"redis://127.0.0.1:{port}/0", redis_key="t59r",
                               idle_seconds=3.0, per_domain=2,
                               scrapy_settings=["DOWNLOAD_DELAY=0.03", "LAIT_REDIS_LEASE_SECONDS=3"])
    crawler = subprocess.Popen(helpers.crawler_cmd(helpers.config_file(cfg, tmp_path / "crawl.yaml")),
                               env=helpers.crawler_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and client.scard("t59r:dupefilter") < 20:
            time.sleep(0.05)
        assert client.scard("t59r:dupefilter") >= 20
        server.terminate()  # a clean shutdown: the append-only file is complete
        server.wait(timeout=30)
        time.sleep(6)
        server = start()
        _, err = crawler.communicate(timeout=300)
    finally:
        crawler.kill()
        server.terminate()
        server.wait(timeout=30)
    text = err.decode()
    assert crawler.returncode == 0, text[-3000:]
    assert "Traceback" not in text and "ConnectionError" not in text.replace("ConnectionError: ", "", 1), text[-3000:]
    said = [line for line in text.splitlines() if "Redis" in line]
    assert len(said) == 2 and "unreachable" in said[0] and "answers again" in said[1], said
    pages, images, refused = _crawled(out)
    assert [u for u, n in pages.items() if n > 1] == [] and [u for u, n in images.items() if n > 1] == []
    missing = (set(undisturbed[0]) - set(pages), set(undisturbed[1]) - set(images), undisturbed[2] ^ refused)
    assert missing == (set(), set(), set()) and set(pages) <= set(undisturbed[0]), (missing, text[-3000:])
