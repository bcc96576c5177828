"""The one rule for which URLs lait stores and links: absolute http(s) URLs with a host.

Every input path checks its page and image URLs with `is_http_url` at intake (URL lists,
archives, the crawl's seeds, the page reader), the writer of `rejected/` keeps anything else
out of its URL columns, and the report links only what passes it. A `javascript:` URL that
reached a table would end in shard JSON and become a link that runs in a reader's browser.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# What a browser would read as the start of an http(s) URL: the scheme at the very start (a
# browser strips leading controls and spaces, and tabs and newlines anywhere, so `\tjavascript:`
# or `java\nscript:` must not pass as anything but what they are), then `//` and a host.
_HTTP_URL_RE = re.compile(r"https?://[^/?#\\]", re.I)
_URL_CONTROLS_RE = re.compile(r"[\x00-\x20\x7f]")
# Most URLs: a host of letters, digits, dots, hyphens and underscores, an optional port, then the
# path, query, fragment or the end. urlsplit would find that host and accept it; it is not asked.
_PLAIN_HOST_RE = re.compile(r"https?://[A-Za-z0-9._-]+(?::[0-9]*)?(?:[/?#]|\Z)", re.I)


def is_http_url(url: object) -> bool:
    """Whether `url` is an absolute http(s) URL with a host: the one rule for every URL lait
    stores as a page or image URL (URL lists, archives, the crawl, pages) and links in its
    report. Any other scheme (`javascript:` in any case, `data:`, `vbscript:`, `file:`, ...),
    a relative reference, or a URL with spaces or control characters (browsers drop or
    reinterpret those, so what they open would not be what was checked) is not one."""
    if not isinstance(url, str) or not _HTTP_URL_RE.match(url) or _URL_CONTROLS_RE.search(url):
        return False
    if _PLAIN_HOST_RE.match(url):
        return True
    try:
        parts = urlsplit(url)
        return parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
    except ValueError:  # an invalid IPv6 literal or port
        return False


def request_host(host: str) -> str | None:
    """`host` as the crawler requests and compares it: lower case, each non-ASCII label in its
    IDNA form (`bücher.example` -> `xn--bcher-kva.example`), as Scrapy's requests and the page
    reader's links write it (w3lib's `safe_url_string`); None when it cannot be written so
    (a label longer than 63 characters, say). Seeds, allowed domains and `--resolve` names go
    through it, so a Unicode name given by a user matches the name the crawler sees."""
    from w3lib.url import safe_url_string

    try:
        encoded = urlsplit(safe_url_string(f"http://{host.strip().rstrip('.')}/")).hostname
    except ValueError:
        return None
    return encoded if encoded and encoded.isascii() else None
