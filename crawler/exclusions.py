"""Domain and URL block lists (`--exclude-domains FILE`, `--exclude-urls FILE`), UT1's format.

The lists of UT1 (Université Toulouse 1 Capitole), which DataTrove filters web data with, are
plain text, one entry a line:

- ``domains``: a host name; it matches itself and every subdomain (``example.com`` matches
  ``img.example.com``, not ``badexample.com``). An IP address matches itself only.
- ``urls``: a URL without its scheme, as squidGuard reads them (``example.com/some/path``): it
  matches that URL and everything below it on a path boundary (``/some/path/x.jpg``,
  ``/some/path?x=1``, not ``/some/pathology``). A leading ``www.`` is ignored on both sides.

Blank lines and ``#`` comments are skipped; case is folded; a ``scheme://`` some lists carry
anyway is dropped. UT1's largest list has millions of entries and every fetcher process holds
the lists, so an entry is held as a 64-bit digest in a sorted array (8 bytes, not the ~100 of
a string in a set; two entries collide with odds of about n/2^64) and the file is read line by
line. A lookup is a binary search per label of the host (domains) or per path segment (URLs).

The crawler applies them in `ExcludeListMiddleware`, before anything else is asked of the host
(not even its robots.txt); `lait ingest-warc` also stores no archived record of a listed URL.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
from scrapy.exceptions import IgnoreRequest

log = logging.getLogger(__name__)

# The rule of a listed URL: crawl/<rule> when the fetcher refuses it, ingest/<rule> for an archived record.
DOMAIN, URL = "domain", "url"


def _entries(path: str) -> Iterator[str]:
    """The entries of a list file, one by one (a list can be large)."""
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError as exc:
        from lait.config import ConfigError

        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    with f:
        for line in f:
            line = line.split("#", 1)[0].strip().lower()
            if "://" in line:
                line = line.split("://", 1)[1]
            if line:
                yield line


def _digest(entry: str) -> int:
    return int.from_bytes(hashlib.blake2b(entry.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def _table(entries: Iterable[str]) -> np.ndarray:
    """Sorted unique uint64 digests of `entries`."""
    digests = array("Q", (_digest(e) for e in entries if e))
    return np.unique(np.frombuffer(digests, np.uint64)) if digests else np.zeros(0, np.uint64)


def _has(table: np.ndarray, entry: str) -> bool:
    if not table.size:
        return False
    d = np.uint64(_digest(entry))
    i = int(np.searchsorted(table, d))
    return i < table.size and table[i] == d


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
    """The domains and URL prefixes of the lists a run was given, as sorted digests."""

    domains: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    urls: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))

    @classmethod
    def of(cls, domains: Iterable[str] = (), urls: Iterable[str] = ()) -> ExclusionLists:
        """Lists of these entries, spelled as in the files."""
        return cls(_table(_domain_key(d) for d in domains), _table(_url_key(u) for u in urls))

    def __bool__(self) -> bool:
        return bool(self.domains.size or self.urls.size)

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
        if self.domains.size:
            if _is_ip(host):
                if _has(self.domains, host):
                    return DOMAIN, host
            else:
                labels = host.split(".")
                for i in range(len(labels)):
                    suffix = ".".join(labels[i:])
                    if _has(self.domains, suffix):
                        return DOMAIN, suffix
        if self.urls.size:
            # Candidates: host, host/a, host/a/b, ... and the whole path with its query.
            base = _strip_www(host)
            path = parts.path or "/"
            if _has(self.urls, base):
                return URL, base
            cut = ""
            for segment in path.strip("/").split("/"):
                cut += "/" + segment
                if _has(self.urls, base + cut):
                    return URL, base + cut
            if parts.query and _has(self.urls, f"{base}{path}?{parts.query}"):
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


def _domain_key(entry: str) -> str:
    return _host_key(entry.split("/", 1)[0])


def _url_key(entry: str) -> str:
    host, slash, rest = entry.partition("/")
    key = _strip_www(_host_key(host))
    rest = rest.rstrip("/")
    return f"{key}/{rest}" if slash and rest else key


@lru_cache(maxsize=4)
def _load_lists(domains_file: str, urls_file: str, *stamps) -> ExclusionLists:
    lists = ExclusionLists(_table(_domain_key(e) for e in _entries(domains_file)) if domains_file else _table(()),
                           _table(_url_key(e) for e in _entries(urls_file)) if urls_file else _table(()))
    if lists:
        log.info("block lists: %d domains, %d URLs", lists.domains.size, lists.urls.size)
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
