"""The W3C TDM Reservation Protocol (TDMRep): publishers who reserve text and data mining rights.

TDMRep has three carriers; lait reads all of them and records what they reserve as
``crawl/tdm_reserved``:

- ``/.well-known/tdmrep.json`` of each origin (this middleware): a JSON array of rules
  ``{"location": PATTERN, "tdm-reservation": 0|1, "tdm-policy": URL}``. The first rule whose
  location matches the request's path (and query) decides; a location is a path pattern as in
  robots.txt (``*`` any characters, a final ``$`` anchors the end, otherwise a prefix). A
  request the file reserves is not sent. A missing, unreadable or unreachable file reserves
  nothing (the other carriers still apply); an unreachable one is asked again after
  ``LAIT_ORIGIN_RETRY_SECONDS``; a decompression bomb (inflating past `MAX_BYTES`) is a
  ``crawl/decompression_bomb`` row of ``rejected/`` and reserves nothing;
- the ``tdm-reservation`` response header, on pages and images, and the
  ``<meta name="tdm-reservation" content="1">`` tag of a page, both read with
  `lait.pagereader.tdm_reservation` by the spider: a reserved response is not kept (error
  ``tdm_reserved``; a page's links are still followed, as for ``noai``).

The header, when present, decides over the meta tag; the well-known file is read before the
request is sent, so a response it reserves is never fetched. ``LAIT_TDMREP_OBEY`` (``lait
crawl --no-obey-tdmrep``) turns all three off.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass

from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.utils.httpobj import urlparse_cached

from lait.crawler.origindocs import OriginDocumentMiddleware
from lait.crawler.reasons import TDM_RESERVED

log = logging.getLogger(__name__)

MAX_BYTES = 256 * 1024


class TdmReserved(IgnoreRequest):
    """A request whose TDM rights the publisher reserved."""

    reason = TDM_RESERVED


@dataclass(frozen=True)
class TdmRule:
    """One rule of a tdmrep.json: where it applies, whether it reserves, and the policy URL."""

    location: str
    pattern: re.Pattern
    reserved: bool
    policy: str | None


def _pattern(location: str) -> re.Pattern:
    anchored = location.endswith("$")
    body = location[:-1] if anchored else location
    regex = ".*".join(re.escape(part) for part in body.split("*"))
    return re.compile(regex + ("$" if anchored else ""))


def parse_tdmrep(body: bytes) -> list[TdmRule]:
    """The rules of a tdmrep.json; malformed entries are skipped, a malformed file has none."""
    try:
        data = json.loads(body.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError):
        return []
    if not isinstance(data, list):
        return []
    rules = []
    for entry in data:
        if not isinstance(entry, dict):
            continue
        location, reservation = entry.get("location"), entry.get("tdm-reservation")
        if not isinstance(location, str) or reservation not in (0, 1, "0", "1"):
            continue
        location = location if location.startswith("/") else "/" + location
        policy = entry.get("tdm-policy")
        rules.append(TdmRule(location, _pattern(location), int(reservation) == 1,
                             policy if isinstance(policy, str) else None))
    return rules


def reserving_rule(rules: list[TdmRule], path: str) -> TdmRule | None:
    """The rule that reserves `path` (path and query), or None: the first matching rule decides."""
    for rule in rules:
        if rule.pattern.match(path):
            return rule if rule.reserved else None
    return None


class TdmRepMiddleware(OriginDocumentMiddleware):
    """Downloader middleware: refuse requests that their origin's tdmrep.json reserves."""

    path = "/.well-known/tdmrep.json"
    max_bytes = MAX_BYTES
    name = "tdmrep"

    def __init__(self, crawler):
        if not crawler.settings.getbool("LAIT_TDMREP_OBEY", True):
            raise NotConfigured
        super().__init__(crawler)

    def verdict_from_response(self, response, body):
        if 200 <= response.status < 300:
            rules = parse_tdmrep(body)
            if rules:
                log.info("%s: %d TDMRep rules", response.url, len(rules))
            return rules, None
        if response.status >= 500:
            return [], self.retry_after
        return [], None

    bomb_consequence = "unreadable: reserves nothing"

    def verdict_from_bomb(self, why):
        return [], None  # unreadable, and asked once: another fetch would be another bomb

    def verdict_from_failure(self, exc):
        return [], self.retry_after

    def check(self, request, rules: list[TdmRule]) -> None:
        if not rules:
            return
        parts = urlparse_cached(request)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        rule = reserving_rule(rules, path)
        if rule is not None:
            self.stats.inc_value("crawl/tdm_reserved_by_file")
            policy = f", policy {rule.policy}" if rule.policy else ""
            raise TdmReserved(f"TDM rights reserved by tdmrep.json (location {rule.location}{policy})")
