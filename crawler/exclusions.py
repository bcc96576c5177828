"""Domain and URL block lists (`--exclude-domains FILE`, `--exclude-urls FILE`), UT1's format.

The lists of UT1 (Université Toulouse 1 Capitole), which DataTrove filters web data with, are
plain text, one entry a line:

- ``domains``: a host name; it matches itself and every subdomain (``example.com`` matches
  ``img.example.com``, not ``badexample.com``). An IP address matches itself only.
- ``urls``: a URL without its scheme, as squidGuard reads them (``example.com/some/path``): it
  matches that URL and everything below it on a path boundary (``/some/path/x.jpg``,
  ``/some/path?x=1``, not ``/some/pathology``). A leading ``www.`` is ignored on both sides.

Blank lines and ``#`` comments are skipped; case is folded; a ``scheme://`` some lists carry
anyway is dropped. Lists are read once per process and held as sets: a lookup costs one set
probe per label of the host (domains) or per path segment (URLs), not a scan of the list.

The crawler applies them in `ExcludeListMiddleware`, before anything else is asked of the host
(not even its robots.txt); `lait ingest-warc` also stores no archived record of a listed URL.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

from scrapy.exceptions import IgnoreRequest

log = logging.getLogger(__name__)

# The rule of a listed URL: crawl/<rule> when the fetcher refuses it, ingest/<rule> for an archived record.
DOMAIN, URL = "domain", "url"


def _lines(path: str) -> list[str]:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        from lait.config import ConfigError

        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip().lower()
        if "://" in line:
            line = line.split("://", 1)[1]
        if line:
            out.append(line)
    return out


def _strip_www(host: str) -> str:
    return host[4:] if host.startswith("www.") else host


def _host_key(host: str) -> str:
    """A host as lists spell it: lower case, no trailing dot, IDNA (punycode) for Unicode."""
    host = host.strip().rstrip(".").lower()
    if host and not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            pass
    return host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class ExclusionLists:
    """The domains and URL prefixes of the lists a run was given."""

    domains: frozenset[str] = frozenset()
    urls: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.domains or self.urls)

    def match(self, url: str) -> tuple[str, str] | None:
        """(list, entry): which list excludes `url` (`DOMAIN` or `URL`) and the entry that
        matched; None when `url` is not listed."""
        try:
            parts = urlsplit(url)
            host = _host_key(parts.hostname or "")
        except ValueError:
            return None
        if not host:
            return None
        if self.domains:
            if _is_ip(host):
                if host in self.domains:
                    return DOMAIN, host
            else:
                labels = host.split(".")
                for i in range(len(labels)):
                    suffix = ".".join(labels[i:])
                    if suffix in self.domains:
                        return DOMAIN, suffix
        if self.urls:
            # Candidates: host, host/a, host/a/b, ... and the whole path with its query.
            base = _strip_www(host)
            path = parts.path or "/"
            if base in self.urls:
                return URL, base
            cut = ""
            for segment in path.strip("/").split("/"):
                cut += "/" + segment
                if base + cut in self.urls:
                    return URL, base + cut
            if parts.query and f"{base}{path}?{parts.query}" in self.urls:
                return URL, f"{base}{path}?{parts.query}"
        return None


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def load_lists(domains_file: str = "", urls_file: str = "") -> ExclusionLists:
    """The lists in these files (either may be ""), read once per process and version of the
    files."""
    return _load_lists(domains_file, urls_file, _stamp(domains_file) if domains_file else None,
                       _stamp(urls_file) if urls_file else None)


@lru_cache(maxsize=4)
def _load_lists(domains_file: str, urls_file: str, *stamps) -> ExclusionLists:
    domains = frozenset(_host_key(d.split("/", 1)[0]) for d in _lines(domains_file)) if domains_file else frozenset()
    urls: set[str] = set()
    if urls_file:
        for entry in _lines(urls_file):
            host, slash, rest = entry.partition("/")
            key = _strip_www(_host_key(host))
            rest = rest.rstrip("/")
            urls.add(f"{key}/{rest}" if slash and rest else key)
    lists = ExclusionLists(domains - {""}, frozenset(urls))
    if lists:
        log.info("exclusion lists: %d domains, %d URLs", len(lists.domains), len(lists.urls))
    return lists


def excluded_rule(kind: str) -> str:
    """The rule, without its stage, of a URL the `kind` list excludes."""
    rule = "excluded_domain" if kind == DOMAIN else "excluded_url"
    return rule


class Excluded(IgnoreRequest):
    """A request refused because its URL is on a block list; `reason` is its crawl/ rule."""

    def __init__(self, kind: str, entry: str, url: str):
        self.reason = f"crawl/{excluded_rule(kind)}"
        super().__init__(f"{url} is on the {kind} block list (entry {entry!r})")


class ExcludeListMiddleware:
    """Refuse requests to listed domains and URLs (the first of lait's downloader middlewares:
    a listed host is asked nothing, not its robots.txt, not even its address)."""

    def __init__(self, lists: ExclusionLists, stats=None):
        self.lists = lists
        self.stats = stats

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        return cls(load_lists(s.get("LAIT_EXCLUDE_DOMAINS") or "", s.get("LAIT_EXCLUDE_URLS") or ""),
                   crawler.stats)

    def process_request(self, request, spider=None):
        if not self.lists:
            return None
        hit = self.lists.match(request.url)
        if hit is not None:
            # Counted and recorded in rejected/ by the spider's errback, like robots.txt refusals.
            raise Excluded(hit[0], hit[1], request.url)
        return None
