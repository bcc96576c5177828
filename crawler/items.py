"""Items of the `lait` spider: one dataclass per output table, fields = the table's columns.

The pipeline writes `item.row()` into `item.table`, partitioned by `item.key()` (the page URL
for pages, the image URL for images and for refused image requests), so every field here
must be a column of `lait.schemas` (the part writer validates it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar

from lait.reasons import check as check_reason


def now() -> datetime:
    return datetime.now(timezone.utc)


def as_row(item: Any) -> dict[str, Any]:
    """An item's fields as its row, values as they are: `dataclasses.asdict` deep-copies each
    value (60 us an image item here, against 2 us), and nothing changes an item once stored."""
    return {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}


@dataclass
class PageItem:
    """A fetched page (any status). `html` is None when it must not be stored (noai, errors)."""

    table: ClassVar[str] = "pages"

    url: str
    status: int
    fetched_at: datetime = dataclasses.field(default_factory=now)
    headers: dict[str, str] | None = None
    content_type: str | None = None
    html: bytes | None = None
    encoding: str | None = None
    depth: int | None = None
    referer: str | None = None
    # None when the page is stored; else why not: http_N, noai, tdm_reserved, not_html,
    # download/<Error> (the vocabulary of `lait.reasons`)
    error: str | None = None
    # The licence the page declares (rel="license", licence meta, a Creative Commons link).
    license: str | None = None

    def key(self) -> str:
        return self.url

    def row(self) -> dict[str, Any]:
        return as_row(self)


@dataclass
class ImageItem:
    """A fetched image URL (any status); `bytes` is None unless it is stored."""

    table: ClassVar[str] = "images"

    image_url: str
    status: int
    page_url: str | None = None
    bytes: bytes | None = None
    mime: str | None = None
    fetched_at: datetime = dataclasses.field(default_factory=now)
    error: str | None = None

    def key(self) -> str:
        return self.image_url

    def row(self) -> dict[str, Any]:
        return as_row(self)


@dataclass
class RejectedItem:
    """A request the crawler refused to send (robots.txt, forbidden address), or a page it
    could not read whole: `crawl/RULE`."""

    table: ClassVar[str] = "rejected"

    reason: str
    page_url: str | None = None
    image_url: str | None = None
    detail: str | None = None

    def __post_init__(self) -> None:
        check_reason(self.reason)  # an unregistered reason fails where it is made, in the spider

    def key(self) -> str:
        return self.image_url or self.page_url or self.reason

    def row(self) -> dict[str, Any]:
        return as_row(self)
