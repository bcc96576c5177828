"""Hosts in a broad crawl: each gets its share of the downloader, and a dead one is dropped.

A page shows images from many hosts, and some of those hosts are dead: names that do not
resolve, ports that refuse, servers that accept and never answer. Scrapy holds a request in
the downloader from the first downloader middleware to the response, but its per-host limit
(``CONCURRENT_REQUESTS_PER_DOMAIN``) counts only the requests past the middlewares, and its
``DownloaderAwarePriorityQueue`` hands out the least busy host's requests even when that host
already holds its share. Requests to one unreachable host could so fill every global slot
(``CONCURRENT_REQUESTS``) and drain at one per timeout while the page host sat idle.

Here:

- `HostAwareDownloader` (``DOWNLOADER``) counts every request it holds per download slot (host),
  from the first middleware on (a request waiting for its host's robots.txt included), and
  records the outcome of every network attempt in `HostHealth`;
- `HostFairQueue` (``SCHEDULER_PRIORITY_QUEUE``) is Scrapy's downloader-aware queue that never
  hands out a request for a host already holding its per-host limit, so a slow host keeps at
  most its share and the others go on;
- `HostHealth` marks a host down after ``LAIT_HOST_DOWN_AFTER`` consecutive connection-level
  failures (DNS, refused, timeout, connection lost; any HTTP answer resets the count); its
  remaining requests fail at once with `HostDown`, recorded as ``crawl/host_down``;
- `HostDownMiddleware` refuses requests to a down host before any other work (robots.txt,
  TDMRep);
- on a stop (Ctrl-C), `HostAwareDownloader.interrupt` cancels what it holds with
  `CrawlInterrupted`, so the crawl closes at once; nothing is recorded for those requests, and
  a resumed crawl requests them again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from urllib.parse import urlsplit

from scrapy.core.downloader import Downloader
from scrapy.exceptions import (
    CannotResolveHostError,
    DownloadCancelledError,
    DownloadConnectionRefusedError,
    DownloadFailedError,
    DownloadTimeoutError,
    IgnoreRequest,
)
from scrapy.pqueues import DownloaderAwarePriorityQueue, DownloaderInterface
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from twisted.internet import defer
from twisted.internet import error as txerror
from twisted.python.failure import Failure

from lait.crawler.reasons import HOST_DOWN

log = logging.getLogger(__name__)

# Failures that say nothing answered: the host (or the way to it) is down. An HTTP status,
# however bad, is an answer.
CONNECTION_FAILURES = (CannotResolveHostError, DownloadConnectionRefusedError, DownloadTimeoutError,
                       DownloadFailedError, txerror.DNSLookupError, txerror.ConnectError,
                       txerror.ConnectionLost, txerror.ConnectionDone, txerror.TimeoutError,
                       defer.TimeoutError, TimeoutError)


def host_of(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


class HostDown(IgnoreRequest):
    """A request not sent because its host was marked down."""

    reason = HOST_DOWN

    def __init__(self, host: str, why: str):
        self.host = host
        self.why = why
        super().__init__(f"host {host} is down: {why}")


class CrawlInterrupted(IgnoreRequest):
    """A request cancelled by a stop of the crawl; it is neither recorded nor counted as done."""


class HostHealth:
    """Consecutive connection failures per host; a host is down from `down_after` on."""

    def __init__(self, down_after: int = 3, stats=None):
        self.down_after = down_after
        self.stats = stats
        self._failures: Counter[str] = Counter()
        self._down: dict[str, str] = {}  # host -> the failure that marked it down

    def down_reason(self, host: str) -> str | None:
        return self._down.get(host)

    def succeeded(self, host: str) -> None:
        self._failures.pop(host, None)

    def failed(self, host: str, exc: BaseException) -> None:
        if not self.down_after or host in self._down or not isinstance(exc, CONNECTION_FAILURES):
            return
        self._failures[host] += 1
        if self._failures[host] >= self.down_after:
            why = f"{self._failures[host]} failures in a row, the last {type(exc).__name__}: {exc}"
            self._down[host] = why
            del self._failures[host]
            log.warning("host %s marked down: %s", host, why)
            if self.stats is not None:
                self.stats.inc_value("crawl/hosts_down")


class HostAwareDownloader(Downloader):
    """Scrapy's downloader with per-host counts, host health and a prompt interrupt."""

    def __init__(self, crawler):
        s = crawler.settings
        self.health = HostHealth(s.getint("LAIT_HOST_DOWN_AFTER", 3), crawler.stats)
        self.held: Counter[str] = Counter()  # slot key -> requests in the downloader
        self.interrupted = False
        self._transfers: dict[int, defer.Deferred] = {}
        super().__init__(crawler)

    def fetch(self, request, spider=None):
        key = self.get_slot_key(request)
        self.held[key] += 1

        def release(result):
            self.held[key] -= 1
            if self.held[key] <= 0:
                del self.held[key]
            return result

        return super().fetch(request).addBoth(release)

    async def _download(self, slot, request):
        host = host_of(request.url)
        if self.interrupted:
            raise CrawlInterrupted("the crawl is stopping")
        why = self.health.down_reason(host)
        if why is not None:  # queued in its slot before the host went down
            raise HostDown(host, why)
        d = deferred_from_coro(super()._download(slot, request))
        self._transfers[id(request)] = d
        try:
            response = await maybe_deferred_to_future(d)
        except (defer.CancelledError, DownloadCancelledError, asyncio.CancelledError) as exc:
            # A cancelled transfer fails with asyncio's CancelledError, which is no Exception:
            # Scrapy's caller would never fire the request's Deferred.
            if self.interrupted:
                raise CrawlInterrupted("the crawl is stopping") from exc
            raise
        except Exception as exc:
            if self.interrupted:
                raise CrawlInterrupted("the crawl is stopping") from exc
            self.health.failed(host, exc)
            raise
        finally:
            self._transfers.pop(id(request), None)
        self.health.succeeded(host)
        return response

    def interrupt(self) -> None:
        """Cancel every request the downloader holds (the crawl is stopping)."""
        if self.interrupted:
            return
        self.interrupted = True
        n = len(self._transfers)
        for slot in self.slots.values():
            while slot.queue:
                _, queued = slot.queue.popleft()
                n += 1
                queued.errback(Failure(CrawlInterrupted("the crawl is stopping")))
        for d in list(self._transfers.values()):
            d.cancel()
        log.info("stopping: %d downloads cancelled", n)


class _HeldInterface(DownloaderInterface):
    """What `HostFairQueue` asks the downloader: the hosts below their limit, and their load."""

    def __init__(self, crawler):
        super().__init__(crawler)
        self.held = getattr(self.downloader, "held", None)
        settings = crawler.settings
        self.default_limit = settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN") or 0
        self.slot_limits = {k: v["concurrency"] for k, v in settings.getdict("DOWNLOAD_SLOTS").items()
                            if "concurrency" in v}

    def stats(self, possible_slots):
        out = []
        for slot in possible_slots:
            n = self._active_downloads(slot)
            limit = self.slot_limits.get(slot, self.default_limit)
            if not limit or n < limit:
                out.append((n, slot))
        return out

    def _active_downloads(self, slot: str) -> int:
        if self.held is None:
            return super()._active_downloads(slot)
        return self.held.get(slot, 0)


class HostFairQueue(DownloaderAwarePriorityQueue):
    """Scrapy's downloader-aware queue that skips hosts already holding their per-host limit.

    Among the hosts below their limit, the least busy goes first (as in Scrapy's queue). When
    every host with queued requests is at its limit, `pop` returns None: the engine asks again
    when a download ends.
    """

    def __init__(self, crawler, *args, **kwargs):
        super().__init__(crawler, *args, **kwargs)
        self._downloader_interface = _HeldInterface(crawler)
        # Requests waiting here by their meta["lait_kind"] (page, image): the spider feeds its
        # frontier's pages by the pages waiting, not by all requests (images pile up on slow
        # hosts). Requests loaded from a JOBDIR at start are not counted (a bound, not a tally).
        self.waiting: Counter[str | None] = Counter()

    def push(self, request) -> None:
        super().push(request)
        self.waiting[request.meta.get("lait_kind")] += 1

    def pop(self):
        request = super().pop()
        if request is not None:
            kind = request.meta.get("lait_kind")
            self.waiting[kind] = max(0, self.waiting[kind] - 1)
        return request


class HostDownMiddleware:
    """Downloader middleware: requests to a host marked down fail at once with `HostDown`."""

    def __init__(self, crawler):
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    def process_request(self, request, spider=None):
        downloader = self.crawler.engine.downloader if self.crawler.engine else None
        health = getattr(downloader, "health", None)
        if health is None:
            return None
        host = host_of(request.url)
        why = health.down_reason(host)
        if why is not None:
            raise HostDown(host, why)
        if getattr(downloader, "interrupted", False):
            raise CrawlInterrupted("the crawl is stopping")
        return None
