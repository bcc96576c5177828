"""`CrawlConfig`: every setting of a crawl, and the Scrapy settings it implies.

`lait crawl` and `scrapy crawl lait -a NAME=VALUE` both resolve one of these; the spider lays
`scrapy_settings(cfg)` over the project settings (`lait.crawler.settings`) at "spider" priority.
The settings of the fetcher itself (politeness, limits, addresses, the resolver override, the
output parts) are a `FetchConfig`, which `lait download` and `lait ingest-warc` share: their
images go through the same fetcher (`ImageFetchConfig`, `lait.crawler.spiders.images`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lait.config import Config, ConfigError, setting
from lait.urls import is_http_url, request_host


@dataclass
class FetchConfig(Config):
    """Settings of the crawler's fetcher: what every command that fetches shares."""

    out: str = setting("", "work directory that receives pages/ and images/ (created if missing)")
    concurrency: int = setting(32, "concurrent requests in total")
    per_domain: int = setting(8, "concurrent requests per domain")
    autothrottle: bool = setting(True, "adapt the request rate to each server's latency")
    obey_robots: bool = setting(True, "obey robots.txt of every host a request goes to (RFC 9309: "
                                "an unreachable robots.txt disallows all); lait's token is `lait`")
    obey_tdmrep: bool = setting(True, "honour the W3C TDM Reservation Protocol (tdmrep.json, "
                                "tdm-reservation header and meta)")
    host_down_after: int = setting(3, "mark a host down after this many connection failures in a row "
                                   "(DNS, refused, timeout) and send it nothing more (0: never)")
    retry_unreachable_after: float = setting(600.0, "seconds before an unreachable robots.txt or "
                                             "tdmrep.json of a host is asked for again")
    resolve: list[str] = setting([], "answer HOST with ADDRESS instead of DNS, as curl's --resolve "
                                 "HOST:PORT:ADDRESS (PORT a number or *; the override holds for "
                                 "every port of HOST)", metavar="HOST:PORT:ADDRESS")
    download_timeout: float = setting(30.0, "seconds before a download is abandoned")
    max_page_bytes: int = setting(10 << 20, "larger pages are abandoned")
    max_image_bytes: int = setting(20 << 20, "larger images are abandoned")
    retries: int = setting(2, "retries of a failed download (timeouts, 5xx)")
    user_agent: str = setting("", "User-Agent header (default: lait's identifying one)")
    allow_loopback: bool = setting(False, "allow requests to addresses that reach this machine: "
                                   "loopback, 0.0.0.0, its own interfaces (demo, tests)")
    allow_private: bool = setting(False, "allow requests to private, link-local and reserved addresses")
    exclude_domains: str = setting("", "file of domains never to request, one a line (UT1 blocklist format: "
                                   "a domain covers its subdomains); refused before robots.txt or DNS, "
                                   "as crawl/excluded_domain", metavar="FILE")
    exclude_urls: str = setting("", "file of URLs never to request, one a line without scheme (UT1 format: "
                                "an entry covers the URLs below it); refused as crawl/excluded_url",
                                metavar="FILE")
    part_rows: int = setting(2000, "commit a part file after this many rows")
    part_seconds: float = setting(30.0, "commit open part files at least this often (seconds)")
    scrapy_settings: list[str] = setting([], "extra Scrapy settings as NAME=VALUE", metavar="NAME=VALUE")
    log_level: str = setting("INFO", "Scrapy's log level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])

    def validate_fetch(self) -> None:
        """Check the fetcher's settings (subclasses call it from `validate`)."""
        if not self.out:
            raise ConfigError("an output work directory is required (--out)")
        for name in ("retries", "host_down_after"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")
        for name in ("concurrency", "per_domain", "part_rows", "max_page_bytes", "max_image_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1")
        for item in self.scrapy_settings:
            if "=" not in item:
                raise ConfigError(f"scrapy_settings: expected NAME=VALUE, got {item!r}")
        try:
            from lait.crawler.dns import parse_resolve  # here: the module needs Twisted, `--help` must not

            parse_resolve(self.resolve)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for name in ("exclude_domains", "exclude_urls"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ConfigError(f"{name}: {path} is not a file")

    def validate(self) -> None:
        self.validate_fetch()

    def fetch_settings(self) -> dict[str, Any]:
        """The values of this config's `FetchConfig` fields."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(FetchConfig)}


@dataclass
class RetrySettings(Config):
    """`--retry-failed` of the commands that fetch a work directory's images (`lait download`,
    `lait ingest-warc`); see `lait.crawler.retry`."""

    retry_failed: bool = setting(False, "then fetch again the images that failed for a transient reason "
                                 "(timeouts, refused or lost connections, 408, 429, 5xx, hosts marked down, "
                                 "an unreachable robots.txt), never the others (other 4xx, not an image, "
                                 "opt-outs, robots.txt refusals)")
    retry_passes: int = setting(1, "retry passes of --retry-failed (each waits, then fetches the transient "
                                "failures left again)")
    retry_delay: float = setting(30.0, "seconds after the latest failure before a retry pass, or longer "
                                 "when a server asked for it with Retry-After")
    retry_max_wait: float = setting(900.0, "wait at most this many seconds before a retry pass, whatever "
                                    "Retry-After asked")

    def validate_retry(self) -> None:
        if self.retry_passes < 0 or self.retry_delay < 0 or self.retry_max_wait < 0:
            raise ConfigError("retry-passes, retry-delay and retry-max-wait must be >= 0")


@dataclass
class ImageFetchConfig(FetchConfig):
    """What the image fetcher (`lait-images` spider) does: fetch every image URL the work
    directory's `tables` reference and does not hold yet (`lait download`, `lait ingest-warc`)."""

    tables: list[str] = setting(["url_list"], "tables whose image_url column lists the images to fetch")
    share: list[int] = setting([0, 1], "[I, ..., N]: fetch only the hosts whose hash modulo N is one of "
                               "the I (one of the units of work side by side, see lait.crawler.units)")

    def validate(self) -> None:
        self.validate_fetch()
        unknown = set(self.tables) - {"url_list", "warc_links", "retry_queue"}
        if not self.tables or unknown:
            raise ConfigError(f"tables: expected url_list, warc_links and/or retry_queue, got {self.tables}")
        if (len(self.share) < 2 or len(set(self.share[:-1])) != len(self.share) - 1
                or not all(0 <= i < self.share[-1] for i in self.share[:-1])):
            raise ConfigError(f"share: expected [I, ..., N] with distinct 0 <= I < N, got {self.share}")

    def owns(self, url: str) -> bool:
        """Whether `url`'s host is in this fetcher's share."""
        *mine, of = self.share
        return of == 1 or host_share(url, of) in mine


@dataclass
class UnitsConfig(Config):
    """Where stage 1's units of work run (list fetching, archive files): this machine or Ray."""

    executor: str = setting("local", "where the units run: processes on this machine, or tasks on a Ray "
                            "cluster (each with the whole --concurrency; see lait.crawler.units)",
                            choices=["local", "ray"], run=True)
    ray_address: str | None = setting(None, "Ray cluster address for --executor ray (default: start a local one)",
                                      run=True)


def host_share(url: str, n: int) -> int:
    """Which of `n` fetcher processes fetches `url`: a stable hash of its host, modulo n."""
    host = (urlsplit(url).hostname or "").encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(host, digest_size=8).digest(), "big") % n


@dataclass
class CrawlConfig(FetchConfig, RetrySettings):
    """Settings of one crawl (`lait crawl`, `scrapy crawl lait -a NAME=VALUE`)."""

    section = "crawl"

    seeds: list[str] = setting([], "seed URLs, or files with one URL per line (# comments)",
                               metavar="URL_OR_FILE")
    allowed_domains: list[str] = setting([], "only follow links to these domains (and their "
                                         "subdomains); images may come from anywhere")
    same_site: bool = setting(True, "without --allowed-domains, follow links only to the seeds' hosts")
    max_depth: int = setting(0, "follow links at most this many hops from a seed (0: no limit)")
    max_pages: int = setting(0, "stop after this many pages (0: no limit)")
    fetch_images: bool = setting(True, "request the images pages show (the images/ table)")
    redis_url: str = setting("", "share the frontier and duplicate filter through Redis "
                             "(scrapy-redis), e.g. redis://host:6379/0, so several crawler "
                             "processes share one crawl")
    redis_key: str = setting("lait", "prefix of the Redis keys of this crawl")
    idle_seconds: float = setting(0.0, "wait this long for new requests before closing when idle "
                                  "(default: 0, or 5 s with --redis-url)")
    jobdir: str = setting("", "Scrapy JOBDIR: queue and seen-requests state, for pause/resume")
    n_partitions: int = setting(0, "partitions of a new work directory (0: 16)")

    def validate(self) -> None:
        if not self.seeds:
            raise ConfigError("at least one seed URL or seeds file is required (--seeds)")
        self.validate_fetch()
        self.validate_retry()
        if self.retry_failed and self.redis_url:
            raise ConfigError("--retry-failed is for a crawl of one machine (not with --redis-url)")
        for name in ("max_depth", "max_pages", "n_partitions"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")
        if self.redis_url and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"redis_url must start with redis://, rediss:// or unix://, got {self.redis_url!r}")
        self._allowed_hosts()

    def follow_domains(self) -> list[str]:
        """The domains whose links are followed, as the crawler's requests name their hosts
        (IDNA: `bücher.example` is `xn--bcher-kva.example`): --allowed-domains, else with
        --same-site the seeds' hosts, else none (follow every link)."""
        if not self.allowed_domains:
            return sorted({urlsplit(u).hostname for u in self.seed_urls()}) if self.same_site else []
        return self._allowed_hosts()

    def _allowed_hosts(self) -> list[str]:
        out = []
        for domain in self.allowed_domains:
            host = request_host(domain)
            if host is None:
                raise ConfigError(f"allowed domain {domain[:200]!r} cannot be written as a host name "
                                  "(IDNA: a label of 1 to 63 characters)")
            out.append(host)
        return out

    def seed_urls(self) -> list[str]:
        """The seed URLs, the URLs given and the lines of the files given, each as the crawler
        requests it (`_as_requested`: `http://bücher.example/` is `http://xn--bcher-kva.example/`)."""
        urls: list[str] = []
        for seed in self.seeds:
            if is_http_url(seed.strip()):
                urls.append(_as_requested(seed.strip(), "seed"))
                continue
            path = Path(seed)
            if ":" in seed and not path.is_file():  # javascript:..., file://..., ftp://...
                raise ConfigError(f"seed {seed[:200]!r} is not an http(s) URL")
            if not path.is_file():
                raise ConfigError(f"seed {seed!r} is neither a URL (scheme://...) nor a file")
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                                  f"{exc.start}); save the seeds file as UTF-8") from None
            except OSError as exc:
                raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
            for n, line in enumerate(text.splitlines(), 1):
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                if not is_http_url(line):
                    raise ConfigError(f"{path}:{n}: not an http(s) URL: {line!r}")
                urls.append(_as_requested(line, f"{path}:{n}: seed"))
        if not urls:
            raise ConfigError("the seeds hold no URL")
        return urls


def _as_requested(url: str, where: str) -> str:
    """A seed as the crawler requests it (the page reader's form of a link: the host in IDNA,
    the path escaped, no fragment), so that the same-site rule, resume and the tables all see
    one spelling; ConfigError when its host cannot be written as a DNS name."""
    from lait.pagereader import resolve_slow

    normal = resolve_slow(url, url)
    host = urlsplit(normal).hostname if normal else None
    if not normal or not host or not host.isascii():
        raise ConfigError(f"{where} {url[:200]!r}: its host cannot be written as a DNS name "
                          "(IDNA: labels of 1 to 63 characters)")
    return normal


def scrapy_settings(cfg: FetchConfig) -> dict[str, Any]:
    """The Scrapy settings a config implies (laid over `lait.crawler.settings`)."""
    s: dict[str, Any] = {
        "LAIT_OUT": cfg.out,
        "LAIT_PART_ROWS": cfg.part_rows,
        "LAIT_PART_SECONDS": cfg.part_seconds,
        "LAIT_IMAGE_MAXSIZE": cfg.max_image_bytes,
        "LAIT_ALLOW_LOOPBACK": cfg.allow_loopback,
        "LAIT_ALLOW_PRIVATE": cfg.allow_private,
        "CONCURRENT_REQUESTS": cfg.concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": cfg.per_domain,
        "AUTOTHROTTLE_ENABLED": cfg.autothrottle,
        "ROBOTSTXT_OBEY": cfg.obey_robots,
        "LAIT_TDMREP_OBEY": cfg.obey_tdmrep,
        "LAIT_HOST_DOWN_AFTER": cfg.host_down_after,
        "LAIT_ORIGIN_RETRY_SECONDS": cfg.retry_unreachable_after,
        "LAIT_RESOLVE": list(cfg.resolve),
        # Absolute: the fetcher may run in another process with another working directory.
        "LAIT_EXCLUDE_DOMAINS": os.path.abspath(cfg.exclude_domains) if cfg.exclude_domains else "",
        "LAIT_EXCLUDE_URLS": os.path.abspath(cfg.exclude_urls) if cfg.exclude_urls else "",
        "DOWNLOAD_TIMEOUT": cfg.download_timeout,
        "DOWNLOAD_MAXSIZE": cfg.max_page_bytes,
        "RETRY_TIMES": cfg.retries,
        "LOG_LEVEL": cfg.log_level,
    }
    if cfg.user_agent:
        s["USER_AGENT"] = cfg.user_agent
    if isinstance(cfg, CrawlConfig):
        s.update(_crawl_settings(cfg))
    for item in cfg.scrapy_settings:
        name, value = item.split("=", 1)
        s[name.strip()] = value.strip()
    return s


def _crawl_settings(cfg: CrawlConfig) -> dict[str, Any]:
    """The Scrapy settings of a crawl's own options (partitions, JOBDIR, a Redis frontier)."""
    s: dict[str, Any] = {"LAIT_PARTITIONS": cfg.n_partitions or None}
    if cfg.jobdir:
        s["JOBDIR"] = cfg.jobdir
    if cfg.redis_url:
        s.update({
            # scrapy-redis's, with leases on the requests each crawler holds (a killed crawler's
            # go back to the queue) and quiet retries while Redis is away: `lait.crawler.lease`.
            "SCHEDULER": "lait.crawler.lease.LeasedScheduler",
            "LAIT_REDIS_KEY": cfg.redis_key,
            "DUPEFILTER_CLASS": "lait.crawler.fingerprints.KindRedisDupeFilter",
            "REDIS_URL": cfg.redis_url,
            "SCHEDULER_PERSIST": True,
            "SCHEDULER_QUEUE_KEY": f"{cfg.redis_key}:requests",
            "SCHEDULER_DUPEFILTER_KEY": f"{cfg.redis_key}:dupefilter",
            "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.PriorityQueue",
            # Requests travel through Redis as JSON, never pickle.
            "SCHEDULER_SERIALIZER": "lait.crawler.jsonqueue",
        })
    return s
