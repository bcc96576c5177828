"""One small document per origin, read before any request to it: robots.txt, tdmrep.json.

`OriginDocumentMiddleware` is the base of `lait.crawler.robots.RobotsTxtMiddleware` and
`lait.crawler.tdmrep.TdmRepMiddleware`. For every request it finds the verdict of the request's
origin (scheme, host and port): cached, or being fetched (the request waits with the others),
or fetched now through the engine, so the fetch passes the same middlewares (address guard,
host health, redirects) and counts in its host's share of the downloader. Every host a request
goes to gets its document, image hosts included: the fetch carries ``allow_offsite``.

Each fetch reads at most `max_bytes` (the download stops there and keeps what it read), and
a compressed body (gzip, deflate, br, zstd: whatever Scrapy decodes) inflates to at most
`max_bytes` too (`InflateLimitMiddleware`): past that it is a decompression bomb, written to
``rejected/`` as ``crawl/decompression_bomb`` and judged by `verdict_from_bomb`. A fetch is not
retried on the spot (a verdict from a failure expires after ``LAIT_ORIGIN_RETRY_SECONDS``, and
the next request to that origin fetches again), and a stop of the crawl passes through to the
waiting requests without leaving a verdict behind.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from scrapy import Request, signals
from scrapy.exceptions import StopDownload
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet import defer

from lait.crawler.hosts import CrawlInterrupted
from lait.crawler.items import RejectedItem
from lait.crawler.reasons import DECOMPRESSION_BOMB

log = logging.getLogger(__name__)

DOC_META = "lait_origin_doc"  # marks the document requests themselves (never checked)
MAX_BYTES_META = "lait_max_bytes"


def origin_of(request) -> str:
    parts = urlparse_cached(request)
    return f"{parts.scheme}://{parts.netloc}".lower()


def _stop_at_limit(data: bytes, request, spider=None) -> None:
    """`bytes_received` handler: stop a document download at its byte limit, keeping the body."""
    limit = request.meta.get(MAX_BYTES_META)
    if not limit:
        return
    seen = request.meta.get("_lait_bytes_seen", 0) + len(data)
    request.meta["_lait_bytes_seen"] = seen
    if seen >= limit:
        raise StopDownload(fail=False)


def is_decompression_bomb(exc: BaseException) -> bool:
    """Whether a failed download is Scrapy's HttpCompressionMiddleware refusing a body that
    inflated past its limit (it raises a plain IgnoreRequest; its message says so)."""
    return "during decompression" in str(exc)


class InflateLimitMiddleware:
    """Downloader middleware just above Scrapy's HttpCompressionMiddleware (590): every body
    inflates to a bounded size.

    Scrapy bounds decompression by the request's ``download_maxsize`` meta (else
    ``DOWNLOAD_MAXSIZE``), the same key that bounds the raw download. A document request sets it
    to 0, so that a robots.txt longer than its limit is cut, not refused; left at 0 it would
    let 1.6 KB of brotli inflate to gigabytes. Responses reach this middleware before they are
    decompressed (process_response runs from the highest order down), so the limit set here
    counts decompressed bytes: a document's own `max_bytes`, and for any other request whose
    limit is 0, ``LAIT_INFLATE_MAXSIZE``.
    """

    def __init__(self, fallback: int):
        self.fallback = fallback
        self.default = 0

    @classmethod
    def from_crawler(cls, crawler):
        mw = cls(crawler.settings.getint("LAIT_INFLATE_MAXSIZE", 64 << 20))
        mw.default = crawler.settings.getint("DOWNLOAD_MAXSIZE")
        return mw

    def process_response(self, request, response, spider=None):
        if not response.headers.get("Content-Encoding"):
            return response
        limit = request.meta.get(MAX_BYTES_META) or request.meta.get("download_maxsize", self.default)
        request.meta["download_maxsize"] = limit or self.fallback
        return response


class OriginDocumentMiddleware:
    """Downloader middleware base: fetch `path` once per origin, and judge requests by it.

    Subclasses set `path`, `max_bytes`, `name` and implement `verdict_from_response`,
    `verdict_from_failure` (each returning ``(verdict, seconds it holds or None for the whole
    crawl)``) and `check(request, verdict)`, which raises to refuse the request.
    """

    path = "/"
    max_bytes = 512 * 1024
    name = "document"
    DOWNLOAD_PRIORITY = 1000

    def __init__(self, crawler):
        self.crawler = crawler
        self.stats = crawler.stats
        self.retry_after = crawler.settings.getfloat("LAIT_ORIGIN_RETRY_SECONDS", 600.0)
        self._verdicts: dict[str, tuple[Any, float | None]] = {}  # origin -> (verdict, expiry)
        self._pending: dict[str, list[defer.Deferred]] = {}
        crawler.signals.connect(_stop_at_limit, signal=signals.bytes_received)

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    async def process_request(self, request, spider=None):
        if request.meta.get(DOC_META) or request.meta.get(self.skip_meta()):
            return None
        if urlparse_cached(request).scheme not in ("http", "https"):
            return None
        verdict = await self.verdict(origin_of(request))
        self.check(request, verdict)
        return None

    def skip_meta(self) -> str:
        return f"dont_obey_{self.name}"

    async def verdict(self, origin: str) -> Any:
        cached = self._verdicts.get(origin)
        if cached is not None and (cached[1] is None or time.monotonic() < cached[1]):
            return cached[0]
        waiting = self._pending.get(origin)
        if waiting is not None:
            d: defer.Deferred = defer.Deferred()
            waiting.append(d)
            return await maybe_deferred_to_future(d)
        self._pending[origin] = []
        try:
            verdict, ttl = await self._fetch(origin)
        except BaseException as exc:  # a stop of the crawl (CrawlInterrupted), or a bug
            for d in self._pending.pop(origin, []):
                d.errback(exc)
            raise
        self._verdicts[origin] = (verdict, None if ttl is None else time.monotonic() + ttl)
        for d in self._pending.pop(origin, []):
            d.callback(verdict)
        return verdict

    async def _fetch(self, origin: str) -> tuple[Any, float | None]:
        request = Request(origin + self.path, priority=self.DOWNLOAD_PRIORITY, callback=NO_CALLBACK,
                          headers={"Accept-Encoding": "identity"},  # a cut body stays readable
                          meta={DOC_META: self.name, "allow_offsite": True, "dont_retry": True,
                                "download_maxsize": 0, MAX_BYTES_META: self.max_bytes})
        self.stats.inc_value(f"crawl/{self.name}_fetched")
        try:
            response = await self.crawler.engine.download_async(request)
        except CrawlInterrupted:
            raise
        except Exception as exc:  # the download failed: no answer at all
            if is_decompression_bomb(exc):
                return await self._bomb(request, exc)
            self.stats.inc_value(f"crawl/{self.name}_failed")
            log.info("%s of %s: %s: %s", self.path, origin, type(exc).__name__, exc)
            return self.verdict_from_failure(exc)
        if "download_stopped" in response.flags:
            self.stats.inc_value(f"crawl/{self.name}_truncated")
        body = response.body[:self.max_bytes]
        return self.verdict_from_response(response, body)

    async def _bomb(self, request, exc: Exception) -> tuple[Any, float | None]:
        """A document that inflated past `max_bytes`: one row in rejected/, and its verdict."""
        verdict, ttl = self.verdict_from_bomb(str(exc))
        self.stats.inc_value(f"crawl/{self.name}_bomb")
        self.stats.inc_value("crawl/decompression_bomb")
        log.warning("%s: decompression bomb (%s)", request.url, self.bomb_consequence)
        item = RejectedItem(DECOMPRESSION_BOMB, page_url=request.url,
                            detail=f"{self.name}: inflates past {self.max_bytes} bytes; "
                                   f"{self.bomb_consequence}")
        await self.crawler.engine.scraper.start_itemproc_async(item, response=None)
        return verdict, ttl

    # -- what subclasses define ----------------------------------------------------------------
    bomb_consequence = "ignored"

    def verdict_from_bomb(self, why: str) -> tuple[Any, float | None]:
        """The verdict of a document that inflated past `max_bytes` (a decompression bomb)."""
        raise NotImplementedError

    def verdict_from_response(self, response, body: bytes) -> tuple[Any, float | None]:
        raise NotImplementedError

    def verdict_from_failure(self, exc: Exception) -> tuple[Any, float | None]:
        raise NotImplementedError

    def check(self, request, verdict: Any) -> None:
        raise NotImplementedError
