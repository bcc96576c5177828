"""Redirects that are not followed end as a row with a reason, never silently.

Scrapy follows a redirect with a new request; when it points back at a URL already requested
(a -> b -> a), the duplicate filter drops it without telling the spider, and the page vanishes
without a row. `RedirectLoopMiddleware` sits just before Scrapy's RedirectMiddleware on the way
back from the downloader and refuses a redirect to a URL of its own chain with
``IgnoreRequest("redirect loop: ...")``, which the spider records as ``crawl/redirect_loop``.

Scrapy's OffsiteMiddleware checks a request twice: when it is scheduled and when it is
downloaded. Refused at scheduling, the request is dropped without its errback being called:
a page redirecting to another site (to `http://10.0.0.1/`, say) and a seed whose host the
allowed domains spell differently left no row at all. `OffsiteMiddleware` here checks at the
download only, where a refusal reaches the spider's errback and becomes a ``crawl/ignored``
row with Scrapy's message. Links the spider finds are checked before they become requests
(`LaitSpider._allowed`), so only redirects and seeds meet this filter.
"""

from __future__ import annotations

from urllib.parse import urljoin

from scrapy.downloadermiddlewares.offsite import OffsiteMiddleware as ScrapyOffsiteMiddleware
from scrapy.exceptions import IgnoreRequest
from w3lib.url import canonicalize_url

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


class RedirectLoopMiddleware:
    def process_response(self, request, response, spider=None):
        if response.status not in REDIRECT_STATUSES or request.meta.get("dont_redirect"):
            return response
        location = response.headers.get("Location")
        if not location:
            return response
        target = canonicalize_url(urljoin(request.url, location.decode("latin-1")))
        chain = [*request.meta.get("redirect_urls", []), request.url]
        if target in {canonicalize_url(u) for u in chain}:
            raise IgnoreRequest(f"redirect loop: {' -> '.join(chain)} -> {target}")
        return response


class OffsiteMiddleware(ScrapyOffsiteMiddleware):
    """Scrapy's offsite filter, at the download only (see the module docstring)."""

    def request_scheduled(self, request, spider=None) -> None:
        return None
