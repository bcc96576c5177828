"""The compact frontier: links wait as URLs and reach Scrapy's scheduler only as it runs low."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lait.crawler.frontier import Frontier
from lait.pagereader import PageRead


def test_frontier_is_fifo_per_depth_and_shallowest_first():
    f = Frontier()
    assert f.add("http://a/2", 2, "http://a/1")
    assert f.add("http://a/1a", 1, "http://a/")
    assert f.add("http://a/1b", 1, "http://a/")
    assert not f.add("http://a/1a", 3, "http://a/x")  # queued once, at the depth it was found
    assert len(f) == 3
    assert [f.pop() for _ in range(3)] == [("http://a/1a", 1, "http://a/"),
                                           ("http://a/1b", 1, "http://a/"),
                                           ("http://a/2", 2, "http://a/1")]
    assert len(f) == 0 and not f
    # A popped link stays seen: finding it again does not queue it again.
    assert f.seen("http://a/1a") and not f.add("http://a/1a", 1, None)
    with pytest.raises(IndexError):
        f.pop()
    # A shallower link found later still goes first.
    f.add("http://a/deep", 5, None)
    f.add("http://a/shallow", 0, None)
    assert f.pop()[0] == "http://a/shallow"


class _Scheduler:
    def __init__(self):
        self.requests = []

    def __len__(self):
        return len(self.requests)


@pytest.fixture
def spider(tmp_path):
    from scrapy.utils.test import get_crawler

    from lait.crawler.config import CrawlConfig
    from lait.crawler.spiders.lait import LaitSpider

    cfg = CrawlConfig(seeds=["http://site.test/"], out=str(tmp_path / "w"), concurrency=4,
                      allow_loopback=True)
    sp = LaitSpider(cfg)
    crawler = get_crawler(LaitSpider, {"LAIT_IMAGE_MAXSIZE": 1 << 20})
    sp._set_crawler(crawler)
    scheduler = _Scheduler()
    crawler.engine = SimpleNamespace(scheduler=scheduler, crawl=scheduler.requests.append)
    return sp


def _page(n: int, prefix: str) -> PageRead:
    return PageRead(links=[f"http://site.test/{prefix}{i}.html" for i in range(n)],
                    images=[f"http://cdn.test/{prefix}.jpg"])


def test_links_wait_in_the_frontier_not_in_scrapy(spider):
    assert spider.low_water == 8  # twice the concurrency
    out = spider._follow(_page(1000, "a"), "http://site.test/", 0, noai=False)
    # Only the image becomes a Request now; the thousand links wait as URLs.
    assert [r.url for r in out] == ["http://cdn.test/a.jpg"]
    assert len(spider.frontier) == 1000
    first = spider.top_up()
    assert [r.url for r in first] == [f"http://site.test/a{i}.html" for i in range(8)]
    assert all(r.meta["depth"] == 1 and r.meta["lait_referer"] == "http://site.test/" for r in first)
    # The scheduler holds low_water requests: nothing more until it drains.
    spider.crawler.engine.scheduler.requests.extend(first)
    assert spider.top_up() == []
    del spider.crawler.engine.scheduler.requests[:5]
    assert [r.url for r in spider.top_up()] == [f"http://site.test/a{i}.html" for i in range(8, 13)]


def test_breadth_first_across_pages(spider):
    spider._follow(_page(3, "deep"), "http://site.test/x", 4, noai=False)
    spider._follow(_page(3, "near"), "http://site.test/", 0, noai=False)
    urls = [r.url for r in spider.top_up()]
    assert urls[:3] == [f"http://site.test/near{i}.html" for i in range(3)]
    assert urls[3:] == [f"http://site.test/deep{i}.html" for i in range(3)]


def test_done_and_offsite_links_never_queued_and_idle_feeds_the_rest(spider):
    from scrapy.exceptions import DontCloseSpider

    spider.done_pages.add("http://site.test/a0.html")
    page = _page(20, "a")
    page.links.append("http://elsewhere.test/x.html")
    spider._follow(page, "http://site.test/", 0, noai=False)
    assert len(spider.frontier) == 19
    # The spider went idle with links left: they are fed to the engine, and it stays open.
    with pytest.raises(DontCloseSpider):
        spider._on_idle()
    fed = spider.crawler.engine.scheduler.requests
    assert len(fed) == spider.low_water and fed[0].url == "http://site.test/a1.html"
    urls = [r.url for r in fed]
    while spider.frontier:  # idle again each time the engine has drained what it was fed
        fed.clear()
        with pytest.raises(DontCloseSpider):
            spider._on_idle()
        urls += [r.url for r in fed]
    assert urls == [f"http://site.test/a{i}.html" for i in range(1, 20)]
    fed.clear()
    spider._on_idle()  # nothing left: the spider may close


def test_max_pages_stops_the_frontier(spider):
    spider.cfg.max_pages = 10
    spider._follow(_page(50, "a"), "http://site.test/", 0, noai=False)
    spider.pages_seen = 10
    assert spider.top_up() == []
    spider._on_idle()  # no DontCloseSpider: the crawl ends with links left over


def test_redis_crawls_keep_links_in_scrapys_scheduler(tmp_path):
    from scrapy.utils.test import get_crawler

    from lait.crawler.config import CrawlConfig
    from lait.crawler.spiders.lait import LaitSpider

    cfg = CrawlConfig(seeds=["http://site.test/"], out=str(tmp_path / "w"),
                      redis_url="redis://127.0.0.1:1/0")
    sp = LaitSpider(cfg)
    sp._set_crawler(get_crawler(LaitSpider, {"LAIT_IMAGE_MAXSIZE": 1 << 20}))
    assert sp.frontier is None
    out = sp._follow(_page(5, "a"), "http://site.test/", 0, noai=False)
    assert sorted(r.url for r in out if r.meta["lait_kind"] == "page") == \
        sorted(f"http://site.test/a{i}.html" for i in range(5))
    assert sp.top_up() == []


def test_images_waiting_behind_a_slow_host_do_not_hold_back_pages(spider):
    """Only page requests in the scheduler count against low_water (lait's HostFairQueue)."""
    from collections import Counter

    queue = SimpleNamespace(waiting=Counter({"image": 500, "page": 3}))
    spider.crawler.engine.scheduler.mqs = queue
    spider.crawler.engine.scheduler.dqs = None
    spider.crawler.engine.scheduler.requests.extend(range(503))
    spider._follow(_page(20, "a"), "http://site.test/", 0, noai=False)
    assert len(spider.top_up()) == spider.low_water - 3
