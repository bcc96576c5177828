"""Issue 18, acceptance 1: the real-web mode with hostile image hosts: every real page stored,
every hostile image in images/ or rejected/ with its reason (the time ratio is measured by
bench/crawl/bench_hostile.py)."""

from __future__ import annotations

from urllib.parse import urlsplit

from lait.workdir import WorkDir


def test_real_web_with_hostile_hosts(shared_data, tmp_path):
    from lait.crawler.config import CrawlConfig
    from lait.crawler.run import crawl
    from lait.testkit.hostile import HostileHosts, kind_of
    from lait.testkit.realweb import RealWebSite
    from lait.testkit.server import SiteServer

    site = RealWebSite(shared_data, max_pages=50)
    with HostileHosts(trickle_delay=0.2) as hosts:
        site.attach_hostile(hosts)
        truth = site.ground_truth()
        with SiteServer(site, cache_size=1 << 14) as srv:
            cfg = CrawlConfig(seeds=[srv.url + "/"], out=str(tmp_path / "w"), allow_loopback=True,
                              autothrottle=False, download_timeout=3, log_level="WARNING",
                              resolve=hosts.crawl_resolve())
            stats = crawl(cfg, timeout=600, quiet=True)
    assert stats["finish_reason"] == "finished"
    work = WorkDir(tmp_path / "w")
    pages = {urlsplit(r["url"]).path: r for r in work.read("pages", columns=["url", "status", "error"]).to_pylist()}
    for path in truth["pages"]:
        assert pages[path]["status"] == 200 and pages[path]["error"] is None, path
    recorded: dict[str, list[str]] = {}
    for row in work.read("images", columns=["image_url", "error"]).to_pylist():
        recorded.setdefault(urlsplit(row["image_url"]).path, []).append(row["error"] or "stored")
    for row in work.read("rejected", columns=["image_url", "reason"]).to_pylist():
        if row["image_url"]:
            recorded.setdefault(urlsplit(row["image_url"]).path, []).append(row["reason"])
    hostile = {u: t for u, t in truth["images"].items() if t.get("hostile")}
    assert len({t["hostile"] for t in hostile.values()}) >= 5
    for url, t in hostile.items():
        assert len(recorded.get(url, [])) == 1, (url, recorded.get(url))
        assert recorded[url][0] in t["reasons"], (url, recorded[url])
    assert not [u for u in recorded if kind_of(u) is None and recorded[u] != ["stored"]
                and truth["images"].get(u, {}).get("keep")]
