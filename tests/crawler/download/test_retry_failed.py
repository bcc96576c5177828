"""Issue 30: `lait download --retry-failed` against a server that fails half of its requests
(503, 429, stalls) during a bad spell: one retry pass, after the wait the server asks for with
Retry-After, gets the images; 404s are never asked for again; every URL ends exactly once."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime

import pytest

from kit.photos import MISSING_PREFIX, FlakySite, PhotoServer, PhotoSite, coco_photos
from kit.pipeline_kit import write_csv
from lait.crawler.retry import RetryPlan, clear_transient, is_transient, is_transient_reject, plan_retry
from lait.crawler.spiders.lait import retry_after_seconds
from lait.parts import PartitionedWriter
from lait.workdir import WorkDir


def lait(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lait", *argv], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("error, transient", [
    ("http_503", True), ("http_500", True), ("http_429", True), ("http_408", True), ("status_502", True),
    ("download/TimeoutError", True), ("download/ConnectionRefusedError", True), ("download/ConnectionLost", True),
    ("download/DownloadTimeoutError", True), ("download/DownloadConnectionRefusedError", True),
    ("download/CannotResolveHostError", False),
    ("http_404", False), ("http_403", False), ("http_410", False), ("not_image", False), ("noai", False),
    ("tdm_reserved", False), ("empty", False), ("download/DNSLookupError", False), (None, False)])
def test_transient_errors(error, transient):
    assert is_transient(error) is transient


def test_transient_rejects():
    assert is_transient_reject("crawl/host_down") and is_transient_reject("crawl/robots_unreachable")
    for reason in ("crawl/robots", "crawl/tdm_reserved", "crawl/refused_private", "download/bad_url"):
        assert not is_transient_reject(reason)


def test_retry_after_values():
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None
    assert retry_after_seconds("99999999") == 86400.0


def test_clear_transient_rewrites_only_the_fetchers_transient_rows(tmp_path):
    work = WorkDir(tmp_path / "W", n_partitions=2).init()
    now = datetime(2026, 1, 1, tzinfo=UTC)
    urls = {k: f"http://h.test/{k}.jpg" for k in ("ok", "busy", "gone", "down", "robots", "unlisted", "archived")}
    with PartitionedWriter(work, "list") as w:
        for k, u in urls.items():
            if k != "unlisted":
                w.write("url_list", w.partition_of(u), {"image_url": u, "caption": k, "list_file": "l", "row": 0})
    with PartitionedWriter(work, "crawl-1") as w:
        for k, status, error in [("ok", 200, None), ("busy", 503, "http_503"), ("gone", 404, "http_404"),
                                 ("unlisted", 503, "http_503")]:
            w.write("images", w.partition_of(urls[k]), {"image_url": urls[k], "bytes": b"x" if not error else None,
                                                        "status": status, "fetched_at": now, "error": error})
        w.reject("crawl/host_down", w.partition_of(urls["down"]), image_url=urls["down"])
        w.reject("crawl/robots", w.partition_of(urls["robots"]), image_url=urls["robots"])
    with PartitionedWriter(work, "warc-a-1") as w:  # what an archive captured stays
        u = urls["archived"]
        w.write("images", w.partition_of(u), {"image_url": u, "status": 503, "fetched_at": now, "error": "http_503"})

    plan = plan_retry(work, ["url_list"])
    assert plan.counts == Counter({"http_503": 1, "crawl/host_down": 1})
    assert plan.last_failure == now.timestamp()
    assert clear_transient(work, ["url_list"]) == plan.counts
    left = {r["image_url"]: r["error"] for r in work.read("images").to_pylist()}
    assert left == {urls["ok"]: None, urls["gone"]: "http_404", urls["unlisted"]: "http_503",
                    urls["archived"]: "http_503"}
    assert [r["reason"] for r in work.read("rejected").to_pylist()] == ["crawl/robots"]
    assert plan_retry(work, ["url_list"]).total == 0


def test_plan_waits_for_retry_after_and_delay():
    plan = RetryPlan(Counter({"http_503": 1}), last_failure=100.0)
    assert plan.not_before(30) == 130.0
    assert plan.not_before(30, retry_after_until=500.0) == 500.0
    assert plan.not_before(30, last_fetch_end=200.0) == 230.0


def test_retry_failed_recovers_a_bad_spell(shared_data, tmp_path):
    photos = coco_photos(shared_data / "photos" / "coco_train")[:30]
    sites, servers = [], []
    for i in range(2):
        files = {f"/coco/{p.name}": p.read_bytes() for p, _ in photos[i * 15:(i + 1) * 15]}
        sites.append(FlakySite(PhotoSite(files), flaky_seconds=4.0, rate=0.5, stall=3.0, seed=i))
        servers.append(PhotoServer(sites[-1], host=f"127.0.30.{i + 1}").start())
    try:
        good = [f"{servers[i // 15].url}/coco/{p.name}" for i, (p, _) in enumerate(photos)]
        missing = [f"{servers[i % 2].url}{MISSING_PREFIX}{i}.jpg" for i in range(6)]
        listing = write_csv(tmp_path / "list.csv", [{"url": u, "caption": "a photo"} for u in good + missing])
        done = lait("download", str(listing), "--out", str(tmp_path / "W"), "--allow-loopback", "--no-autothrottle",
                    "--concurrency", "8", "--processes", "1", "--n-partitions", "4", "--retries", "0",
                    "--download-timeout", "1.5", "--retry-failed", "--retry-delay", "0.2",
                    "--log-level", "WARNING", "--no-progress")
    finally:
        for s in servers:
            s.close()
    assert done.returncode == 0, done.stderr[-3000:]
    log = [entry for site in sites for entry in site.log]
    got = Counter(kind for _, kind in log)
    assert got["503"] and got["429"] and got["stall"], got  # the bad spell did hit the first fetch
    lines = [line for line in done.stderr.splitlines() if "pass " in line]
    assert any(line.startswith("lait download: pass 0 (first fetch): ") for line in lines), lines
    first = next(line for line in lines if "rows failed for a transient reason" in line)
    assert int(first.split("retry pass 1: ")[1].split()[0]) > 0
    last = next(line for line in lines if line.startswith("lait download: retry pass 1: ") and "failed" not in line)
    assert "ok: " in last and "http_503" not in last and "http_429" not in last, last

    work = WorkDir(tmp_path / "W")
    images = work.read("images", columns=["image_url", "status", "error"]).to_pylist()
    rejected = [r for r in work.read("rejected").to_pylist() if r["reason"].startswith("crawl/")]
    # Every URL exactly once: an images/ row or a crawl/ reject, never both, never twice.
    outcomes = Counter([r["image_url"] for r in images] + [r["image_url"] for r in rejected])
    assert set(outcomes) == set(good + missing) and set(outcomes.values()) == {1}, outcomes
    ok = {r["image_url"] for r in images if r["status"] == 200 and r["error"] is None}
    assert len(ok & set(good)) >= 0.99 * len(good), [r for r in images if r["image_url"] not in ok]
    assert {r["error"] for r in images if r["image_url"] in missing} == {"http_404"}
    # A list row answered 404 is never asked for again (a 503 before it may be).
    answered_404 = 0
    for site in sites:
        for path in {p for p, kind in site.log if kind == "404" and p.startswith(MISSING_PREFIX)}:
            kinds = [kind for p, kind in site.log if p == path]
            assert kinds[-1] == "404" and kinds.count("404") == 1, (path, kinds)
            answered_404 += 1
    assert answered_404 == len(missing)


def test_crawl_retry_failed_recovers_the_images_of_a_bad_spell(tmp_path):
    """`lait crawl --retry-failed`: the crawl's images have no list to be read from again, so a
    pass queues the failed ones with their pages in retry_queue/ and the image fetcher takes
    them from there; the queue is empty afterwards."""
    from lait.testkit.generator import generate_site
    from lait.testkit.server import SiteServer

    site = generate_site(10, seed=3)
    flaky = FlakySite(site, flaky_seconds=4.0, rate=0.5, stall=3.0, seed=7, only=lambda p: p.startswith("/img/"))
    with SiteServer(flaky, cache_size=0) as server:
        done = lait("crawl", "--seeds", server.url + "/", "--out", str(tmp_path / "W"), "--allow-loopback",
                    "--no-autothrottle", "--n-partitions", "4", "--retries", "0", "--download-timeout", "1.5",
                    "--retry-failed", "--retry-delay", "0.2", "--log-level", "WARNING")
    assert done.returncode == 0, done.stderr[-3000:]
    got = Counter(kind for _, kind in flaky.log)
    assert got["503"] + got["429"] + got["stall"] > 0, got
    first = next(line for line in done.stderr.splitlines() if "rows failed for a transient reason" in line)
    assert int(first.split("retry pass 1: ")[1].split()[0]) > 0
    work = WorkDir(tmp_path / "W")
    images = work.read("images", columns=["image_url", "status", "error"]).to_pylist()
    rejected = [r for r in work.read("rejected").to_pylist() if r["reason"].startswith("crawl/") and r["image_url"]]
    outcomes = Counter([r["image_url"] for r in images] + [r["image_url"] for r in rejected])
    assert outcomes and set(outcomes.values()) == {1}, outcomes
    assert not [r for r in images if is_transient(r["error"])] and not [
        r for r in rejected if is_transient_reject(r["reason"])]
    assert work.part_files("retry_queue") == []
    for path in {p for p, kind in flaky.log if kind == "404" and p.startswith("/img/")}:
        kinds = [kind for p, kind in flaky.log if p == path]
        assert kinds[-1] == "404" and kinds.count("404") == 1, (path, kinds)
