"""Request fingerprints that know what a request is for: a page or an image.

A URL can be both: `<a href="photo.jpg">` and `<img src="photo.jpg">` on one page. Scrapy's
duplicate filter fingerprints the URL alone, so whichever request came second was dropped
without a row anywhere, and an image linked as a page never reached `images/`. Here the
fingerprint of an image request differs from the page request's for the same URL: each is
fetched once as what it is, and each ends in its own table (the page request of an image as a
`pages/` row with error `not_html`).

`KindFingerprinter` is Scrapy's `REQUEST_FINGERPRINTER_CLASS` (the default duplicate filter
and JOBDIR's `requests.seen` use it); `KindRedisDupeFilter` does the same for the Redis
frontier shared by several crawlers (scrapy-redis fingerprints requests itself).
"""

from __future__ import annotations

import hashlib

from scrapy.utils.request import RequestFingerprinter


def _kind_salt(request) -> bytes:
    kind = request.meta.get("lait_kind")
    return b"" if kind in (None, "page") else f"lait_kind={kind}\n".encode()


class KindFingerprinter:
    """Scrapy's fingerprint, salted for requests that are not pages (images)."""

    def __init__(self, crawler=None):
        self._base = RequestFingerprinter(crawler)

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    def fingerprint(self, request) -> bytes:
        base = self._base.fingerprint(request)
        salt = _kind_salt(request)
        return hashlib.sha1(salt + base).digest() if salt else base


def _redis_dupefilter() -> type:
    from scrapy_redis.dupefilter import RFPDupeFilter

    class KindRedisDupeFilter(RFPDupeFilter):
        """scrapy-redis's shared duplicate filter with the same page/image distinction."""

        def request_fingerprint(self, request):
            base = super().request_fingerprint(request)
            salt = _kind_salt(request)
            return hashlib.sha1(salt + base.encode()).hexdigest() if salt else base

    KindRedisDupeFilter.__module__ = __name__
    return KindRedisDupeFilter


def __getattr__(name: str):
    """`KindRedisDupeFilter`, made on first use: only Redis mode imports scrapy-redis (and redis),
    0.2 s of every crawler process's start-up otherwise."""
    if name == "KindRedisDupeFilter":
        cls = globals()[name] = _redis_dupefilter()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
