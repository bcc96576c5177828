"""robots.txt for every host a request goes to, as RFC 9309 says (it replaces Scrapy's).

Scrapy's own middleware asks for robots.txt with a request the offsite filter drops when the
host is not one of the spider's domains, and on any failure it allows everything. Here, for
every origin (scheme, host, port) a request goes to, page and image hosts alike:

- the first `MAX_BYTES` (500 KiB, RFC 9309 2.5) are read and parsed, the rest is not fetched;
- 2xx: the rules of the group naming lait's product token (``ROBOTSTXT_USER_AGENT``, ``lait``)
  apply, else the ``*`` group (Protego's matching); they hold for 24 hours (2.4);
- redirects are followed (up to ``REDIRECT_MAX_TIMES``); a robots.txt that is unavailable
  (4xx, too many redirects) allows everything (2.3.1.3);
- a decompression bomb (a gzip, deflate, br or zstd body inflating past `MAX_BYTES`) cannot be
  read: it counts as unreachable for 24 hours (disallow all), and is a
  ``crawl/decompression_bomb`` row of ``rejected/``;
- unreachable (5xx, timeout, refused, DNS failure, any other failed download) disallows
  everything (2.3.1.4): requests are refused as ``crawl/robots_unreachable``, or as
  ``crawl/host_unreachable`` when no connection to the host could be made at all (no name, no
  route, refused: the host is down, not its robots.txt), and the next request to
  that origin after ``LAIT_ORIGIN_RETRY_SECONDS`` asks again. A host that was marked down
  meanwhile refuses them as ``crawl/host_down``.

Refused requests raise `RobotsForbidden` (``crawl/robots``), `RobotsUnreachable` or
`HostUnreachable`, which the spider records in ``rejected/``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from protego import Protego
from scrapy.exceptions import IgnoreRequest, NotConfigured

from lait.crawler.hosts import HostDown, host_of
from lait.crawler.origindocs import OriginDocumentMiddleware
from lait.crawler.reasons import HOST_UNREACHABLE, ROBOTS_UNREACHABLE

log = logging.getLogger(__name__)

MAX_BYTES = 500 * 1024
RULES_TTL = 24 * 3600.0
ROBOTS_REASON = "crawl/robots"


class RobotsForbidden(IgnoreRequest):
    """A request robots.txt disallows."""

    reason = ROBOTS_REASON

    def __init__(self, url: str, token: str):
        super().__init__(f"Forbidden by robots.txt (user-agent token {token!r}): {url}")


class RobotsUnreachable(IgnoreRequest):
    """A request to an origin whose robots.txt could not be fetched: RFC 9309 disallows all."""

    reason = ROBOTS_UNREACHABLE

    def __init__(self, origin: str, why: str):
        super().__init__(f"robots.txt of {origin} unreachable ({why}): disallow all")


class HostUnreachable(RobotsUnreachable):
    """A request to an origin no connection could be made to when its robots.txt was asked
    for: the request itself was never sent, and the host, not a rule, is why."""

    reason = HOST_UNREACHABLE

    def __init__(self, origin: str, why: str):
        IgnoreRequest.__init__(self, f"host {origin} unreachable ({why}): the request was never sent")


# Failures of the connection itself (Twisted's and Scrapy's names): the host never answered.
# A 5xx, a cut body or a bomb is an answer: robots.txt unreachable, the host reachable.
# A download timeout is not among them: it cannot tell a host that never answered from a slow one.
_NO_CONNECTION = ("DNSLookupError", "CannotResolveHostError", "ConnectionRefusedError", "ConnectError",
                  "NoRouteError", "TCPTimedOutError", "DownloadConnectionRefusedError", "UnknownHostError")


def is_no_connection(exc: BaseException) -> bool:
    """True when `exc` says no connection to the host was made (by its class or a base's name)."""
    return any(cls.__name__ in _NO_CONNECTION for cls in type(exc).__mro__)


@dataclass(frozen=True)
class RobotsVerdict:
    """What an origin's robots.txt says: its rules, allow all (None), or unreachable (why)."""

    rules: Protego | None = None
    unreachable: str | None = None
    no_connection: bool = False  # unreachable because the host never answered at all


ALLOW_ALL = RobotsVerdict()


def parse_robots(body: bytes) -> Protego:
    """Protego rules of the first `MAX_BYTES` of a robots.txt (UTF-8, a BOM ignored)."""
    text = body[:MAX_BYTES].decode("utf-8", errors="replace").lstrip("\ufeff")
    return Protego.parse(text)


def verdict_for_status(status: int, body: bytes) -> tuple[RobotsVerdict, float | None]:
    """The verdict of a robots.txt answer with `status` (see the module docstring)."""
    if 200 <= status < 300:
        return RobotsVerdict(rules=parse_robots(body)), RULES_TTL
    if 300 <= status < 500:
        return ALLOW_ALL, RULES_TTL
    return RobotsVerdict(unreachable=f"status {status}"), None


class RobotsTxtMiddleware(OriginDocumentMiddleware):
    """Downloader middleware: RFC 9309 robots.txt for every origin (``ROBOTSTXT_OBEY``)."""

    path = "/robots.txt"
    max_bytes = MAX_BYTES
    name = "robots"

    def __init__(self, crawler):
        if not crawler.settings.getbool("ROBOTSTXT_OBEY"):
            raise NotConfigured
        super().__init__(crawler)
        self.token = (crawler.settings.get("ROBOTSTXT_USER_AGENT") or "lait").strip().lower()

    def skip_meta(self) -> str:
        return "dont_obey_robotstxt"  # Scrapy's meta key, for requests that must skip robots.txt

    def verdict_from_response(self, response, body):
        verdict, ttl = verdict_for_status(response.status, body)
        if verdict.unreachable:
            return verdict, self.retry_after
        return verdict, ttl

    bomb_consequence = "unreadable: disallow all (RFC 9309 2.3.1.4)"

    def verdict_from_bomb(self, why):
        # Not a cut robots.txt whose head can be read (2.5): a body built to exhaust memory,
        # whose first 500 KiB say nothing. Held for a day, so a crawl asks for it once.
        return RobotsVerdict(unreachable=f"decompression bomb: {why}"), RULES_TTL

    def verdict_from_failure(self, exc):
        if isinstance(exc, IgnoreRequest) and "max redirections" in str(exc):
            return ALLOW_ALL, RULES_TTL  # too many redirects: unavailable (RFC 9309 2.3.1.2)
        return (RobotsVerdict(unreachable=f"{type(exc).__name__}: {exc}", no_connection=is_no_connection(exc)),
                self.retry_after)

    def check(self, request, verdict: RobotsVerdict) -> None:
        if verdict.unreachable is not None:
            downloader = self.crawler.engine.downloader
            health = getattr(downloader, "health", None)
            host = host_of(request.url)
            why = health.down_reason(host) if health is not None else None
            if why is not None:
                raise HostDown(host, why)
            origin = request.url.split("/", 3)[2]
            if verdict.no_connection:
                self.stats.inc_value("robotstxt/host_unreachable")
                raise HostUnreachable(origin, verdict.unreachable)
            self.stats.inc_value("robotstxt/unreachable")
            raise RobotsUnreachable(origin, verdict.unreachable)
        if verdict.rules is not None and not verdict.rules.can_fetch(request.url, self.token):
            self.stats.inc_value("robotstxt/forbidden")
            raise RobotsForbidden(request.url, self.token)
