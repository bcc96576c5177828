"""Acceptance 3: a crawl killed with SIGKILL and restarted ends with every page exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter

import pytest

from lait.workdir import WorkDir


@pytest.fixture()
def slow_web():
    from lait.testkit.generator import generate_site
    from lait.testkit.server import SiteServer, SlowSite

    site = generate_site(40, seed=5)
    with SiteServer(SlowSite(site, 0.1)) as srv:
        yield site, srv.url


def test_sigkill_then_restart_gives_every_page_once(slow_web, tmp_path, helpers):
    from lait.crawler.run import crawl

    site, base = slow_web
    out, jobdir = tmp_path / "work", tmp_path / "job"
    cfg = helpers.crawl_config(out, [base + "/"], jobdir=str(jobdir), per_domain=2,
                               n_partitions=2, part_rows=3, part_seconds=0.3)
    config = helpers.config_file(cfg, tmp_path / "crawl.yaml")
    proc = subprocess.Popen(helpers.crawler_cmd(config), env=helpers.crawler_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    work = WorkDir(out)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "lait.json").exists() and work.count("pages") >= 10:
                break
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the crawl ended before it could be killed"
    expected = {p for p, t in site.ground_truth()["pages"].items() if not t["disallowed"]}
    before = work.count("pages")
    assert 10 <= before < len(expected), "the kill did not land in the middle of the crawl"
    assert (jobdir / "lait.running").exists()  # the unclean stop is visible to the restart

    stats = crawl(cfg, timeout=300, quiet=True)
    assert stats["finish_reason"] == "finished"
    assert stats["crawl/resumed_pages"] == before
    urls = [u[len(base):] for u in work.read("pages", columns=["url"]).column("url").to_pylist()]
    counts = Counter(urls)
    assert [u for u, n in counts.items() if n > 1] == []
    assert expected - set(counts) == set()
    images = work.read("images", columns=["image_url"]).column("image_url").to_pylist()
    assert len(images) == len(set(images))
    assert not (jobdir / "lait.running").exists()


def test_rerun_of_a_finished_crawl_fetches_nothing_again(local_web, tmp_path, helpers):
    from lait.crawler.run import crawl

    _, base = local_web
    cfg = helpers.crawl_config(tmp_path / "w", [base + "/"], max_depth=1)
    first = crawl(cfg, quiet=True)
    again = crawl(cfg, quiet=True)
    work = WorkDir(tmp_path / "w")
    assert again["crawl/resumed_pages"] == first["crawl/rows_pages"] == work.count("pages")
    assert again.get("crawl/rows_pages", 0) == 0 and again.get("crawl/rows_images", 0) == 0
