"""The crawl's frontier of pages still to request, kept as URLs rather than Scrapy Requests.

A breadth-first crawl discovers pages far faster than it fetches them: one listing page can
link to every article of a site, and the links of each depth wait until the depth before is
done. As Scrapy ``Request`` objects, the 19,208 links of the local web's 20,000-article home
page took 13 MB, and their fingerprints another 8 MB (measured in-process), before the
scheduler and middlewares add theirs. This frontier holds each link as ``(url, referer)`` in a
FIFO per depth, about 200 bytes with its URL, and the spider turns links into Requests only as
Scrapy's scheduler runs low (`lait.crawler.spiders.lait.LaitSpider.top_up`), shallowest depth
first, so the crawl order stays breadth-first.

A URL enters the frontier at most once (exact string; Scrapy's duplicate filter still
canonicalises behind it). With a Redis-shared crawl the frontier is Redis, and this class is
not used.
"""

from __future__ import annotations

from collections import deque


class Frontier:
    """Links waiting to be requested: FIFO within a depth, shallowest depth first."""

    def __init__(self) -> None:
        self._by_depth: dict[int, deque[tuple[str, str | None]]] = {}
        self._queued: set[str] = set()
        self._size = 0

    def add(self, url: str, depth: int, referer: str | None) -> bool:
        """Queue `url` found at `depth` on page `referer`; False when it was queued before."""
        if url in self._queued:
            return False
        self._queued.add(url)
        queue = self._by_depth.get(depth)
        if queue is None:
            queue = self._by_depth[depth] = deque()
        queue.append((url, referer))
        self._size += 1
        return True

    def pop(self) -> tuple[str, int, str | None]:
        """The oldest link of the shallowest depth, as (url, depth, referer)."""
        if not self._size:
            raise IndexError("pop from an empty frontier")
        depth = min(self._by_depth)
        queue = self._by_depth[depth]
        url, referer = queue.popleft()
        if not queue:
            del self._by_depth[depth]
        self._size -= 1
        return url, depth, referer

    def seen(self, url: str) -> bool:
        """Whether `url` was ever queued (popped links included)."""
        return url in self._queued

    def __len__(self) -> int:
        return self._size
