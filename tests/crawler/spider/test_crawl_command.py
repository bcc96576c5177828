"""`lait crawl` flags and config, the seeds file, and the JSON request serializer for Redis."""

from __future__ import annotations

import argparse

import pytest

from lait.config import ConfigError


def _parse(argv):
    from lait.app import crawl as command

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    command.register(sub)
    return parser.parse_args(argv)


def test_flags_become_a_config_and_scrapy_settings(tmp_path):
    from lait.crawler.config import CrawlConfig, scrapy_settings

    args = _parse(["crawl", "--seeds", "http://a.example/", "--out", str(tmp_path), "--max-pages", "7",
                   "--allow-loopback", "--redis-url", "redis://127.0.0.1:1/0", "--no-autothrottle"])
    cfg = CrawlConfig.from_args(args)
    assert cfg.max_pages == 7 and cfg.allow_loopback and not cfg.allow_private
    s = scrapy_settings(cfg)
    assert s["LAIT_ALLOW_LOOPBACK"] is True and s["AUTOTHROTTLE_ENABLED"] is False
    assert s["SCHEDULER"] == "lait.crawler.lease.LeasedScheduler"
    assert s["SCHEDULER_SERIALIZER"] == "lait.crawler.jsonqueue"  # never pickle in the shared queue


def test_polite_defaults():
    import lait.crawler.settings as s
    from lait.crawler.config import CrawlConfig, scrapy_settings

    cfg = CrawlConfig(seeds=["http://a.example/"], out="w")
    merged = {**{k: getattr(s, k) for k in dir(s) if k.isupper()}, **scrapy_settings(cfg)}
    assert merged["ROBOTSTXT_OBEY"] and merged["AUTOTHROTTLE_ENABLED"]
    assert merged["LAIT_ALLOW_LOOPBACK"] is False and merged["LAIT_ALLOW_PRIVATE"] is False
    assert merged["CONCURRENT_REQUESTS_PER_DOMAIN"] <= 8 and merged["DOWNLOAD_TIMEOUT"] <= 60
    assert "lait" in merged["USER_AGENT"] and "+http" in merged["USER_AGENT"]
    assert "Pickle" not in merged["SCHEDULER_DISK_QUEUE"]


def test_seeds_file_and_bad_seeds(tmp_path):
    from lait.crawler.config import CrawlConfig

    seeds = tmp_path / "seeds.txt"
    seeds.write_text("# news\nhttp://a.example/\n\nhttps://b.example/x  # trailing comment\n")
    cfg = CrawlConfig(seeds=[str(seeds), "http://c.example/"], out="w")
    assert cfg.seed_urls() == ["http://a.example/", "https://b.example/x", "http://c.example/"]
    with pytest.raises(ConfigError, match="neither a URL"):
        CrawlConfig(seeds=["missing.txt"], out="w").seed_urls()
    seeds.write_text("ftp://x/\n")
    with pytest.raises(ConfigError, match="not an http"):
        CrawlConfig(seeds=[str(seeds)], out="w").seed_urls()
    # Issue 29: no other scheme, in any case mix, as a seed given or listed.
    for bad in ("JaVaScRiPt:alert(1)", "javascript://a.example/%0aalert(1)", "data:text/html,x", "vbscript:x",
                "file:///etc/passwd"):
        with pytest.raises(ConfigError, match="not an http"):
            CrawlConfig(seeds=[bad], out="w").seed_urls()
        seeds.write_text(f"http://a.example/\n{bad}\n")
        with pytest.raises(ConfigError, match="not an http"):
            CrawlConfig(seeds=[str(seeds)], out="w").seed_urls()


def test_unicode_hosts_are_named_as_the_crawler_requests_them():
    """Issue 51: seeds, the same-site domains and --allowed-domains in their IDNA form, the one
    Scrapy's requests and the page reader's links have; a host with no such form is one line."""
    from lait.crawler.config import CrawlConfig
    from lait.crawler.dns import parse_resolve

    cfg = CrawlConfig(seeds=["http://Bücher.example/ä", "https://a.example/x#top"], out="w")
    assert cfg.seed_urls() == ["http://xn--bcher-kva.example/%C3%A4", "https://a.example/x"]
    assert cfg.follow_domains() == ["a.example", "xn--bcher-kva.example"]
    assert CrawlConfig(seeds=["http://a.example/"], out="w", same_site=False).follow_domains() == []
    cfg = CrawlConfig(seeds=["http://a.example/"], out="w", allowed_domains=["BÜCHER.example", "a.example"])
    assert cfg.follow_domains() == ["xn--bcher-kva.example", "a.example"]
    assert parse_resolve(["bücher.example:*:127.0.0.1"]) == {"xn--bcher-kva.example": "127.0.0.1"}
    long_label = "ü" * 70 + ".example"
    with pytest.raises(ConfigError, match="cannot be written as a DNS name"):
        CrawlConfig(seeds=[f"http://{long_label}/"], out="w").seed_urls()
    with pytest.raises(ConfigError, match="cannot be written as a host name"):
        CrawlConfig(seeds=["http://a.example/"], out="w", allowed_domains=[long_label]).validate()


@pytest.mark.parametrize("argv,message", [
    (["crawl", "--out", "w"], "seed"),
    (["crawl", "--seeds", "http://a/"], "work directory"),
    (["crawl", "--seeds", "http://a/", "--out", "w", "--max-pages", "-1"], "max_pages"),
    (["crawl", "--seeds", "http://a/", "--out", "w", "--redis-url", "localhost:6379"], "redis_url"),
])
def test_config_errors(argv, message):
    from lait.crawler.config import CrawlConfig

    with pytest.raises(ConfigError, match=message):
        CrawlConfig.from_args(_parse(argv))


def test_json_queue_round_trips_request_dicts():
    import scrapy
    from scrapy.utils.request import request_from_dict

    from lait.crawler import jsonqueue

    req = scrapy.Request("http://a.example/x", method="POST", body=b"\x00\xffbin",
                         headers={"X-A": "1"}, meta={"depth": 2, "lait_kind": "image"}, priority=10)
    data = jsonqueue.dumps(req.to_dict())
    assert isinstance(data, bytes) and b"\x80" not in data  # JSON, not a pickle stream
    back = request_from_dict(jsonqueue.loads(data))
    assert (back.url, back.method, back.body, back.priority) == (req.url, req.method, req.body, 10)
    assert back.headers.get("X-A") == b"1" and back.meta["lait_kind"] == "image"
