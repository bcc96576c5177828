"""Redirect loops end as a row with a reason, not in Scrapy's duplicate filter.

Scrapy follows a redirect with a new request; when it points back at a URL already requested
(a -> b -> a), the duplicate filter drops it without telling the spider, and the page vanishes
without a row. `RedirectLoopMiddleware` sits just before Scrapy's RedirectMiddleware on the way
back from the downloader and refuses a redirect to a URL of its own chain with
``IgnoreRequest("redirect loop: ...")``, which the spider records as ``crawl/redirect_loop``.
"""

from __future__ import annotations

from urllib.parse import urljoin

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
