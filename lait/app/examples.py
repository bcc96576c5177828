"""Examples of what each rejection reason dropped, for the report: the text, a thumbnail of the
image where its bytes were stored, the page it came from and the rule's detail.

A builder tunes a rule by looking at what it drops; counts alone do not say whether
`clean/boilerplate` took "click to enlarge" or real captions. Only a few rows per reason are
read (the `rejected/` parts are read one at a time until every reason has its examples), and
thumbnails are drawn from `images/` for those URLs only, with a pixel limit: an image rejected
as a decompression bomb is not decoded here either.
"""

from __future__ import annotations

import io
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

from lait import storage
from lait.workdir import WorkDir, partition_of

log = logging.getLogger(__name__)

EXAMPLES_PER_REASON = 4
THUMB = 160
MAX_THUMB_PIXELS = 40_000_000  # larger images get no thumbnail (filter's default max_pixels is 89 M)
COLUMNS = ["reason", "image_url", "page_url", "text", "detail"]


def stage_settings(work: WorkDir, stage: str) -> dict[str, Any]:
    """The settings `stage` last completed with in `work` (`steps.recorded_settings`), {} when
    none or unreadable (a report says what it can): the run's own thresholds."""
    from lait.app.steps import recorded_settings
    from lait.config import ConfigError

    try:
        return recorded_settings(work.url, stage)[0]
    except (ConfigError, OSError) as exc:
        log.warning("stats: %s", exc)
        return {}


def run_max_unsafe(work: WorkDir, filter_settings: dict[str, Any] | None = None) -> float:
    """The max_unsafe stage 2 ran with (its default when unknown): thumbnails above it are
    blurred. `filter_settings`: stage 2's `stage_settings`, when the caller has read them."""
    from lait.filters.unsafe import DEFAULT_MAX_UNSAFE

    if filter_settings is None:
        filter_settings = stage_settings(work, "filter")
    try:
        return float(filter_settings.get("max_unsafe", DEFAULT_MAX_UNSAFE))
    except (TypeError, ValueError):
        return DEFAULT_MAX_UNSAFE


@dataclass
class Example:
    """One rejected row, as the report shows it."""

    reason: str
    page_url: str | None
    image_url: str | None
    text: str | None
    detail: str | None
    thumb: str | None = None  # JPEG data URI of the image, when its bytes were stored
    image_note: str | None = None  # why there is no thumbnail, when there is an image URL
    blurred: bool = False  # the thumbnail is blurred: unsafe, or no model could check it


def reject_examples(work: WorkDir, reasons: Counter, per_reason: int = EXAMPLES_PER_REASON,
                    thumbnails: bool = True) -> dict[str, list[Example]]:
    """Up to `per_reason` examples of every reason in `reasons` (reason -> its number of rows),
    from as many different pages as the reason's rows come from: in the order `rejected/` holds
    them, the first row of each page first, then further rows of the same pages where there are
    too few pages. Each with a thumbnail when `thumbnails` and the image's bytes are in
    `images/`. `rejected/` is read until every reason has its pages or all its rows were seen."""
    picked: dict[str, list[Example]] = {r: [] for r in reasons}
    spare: dict[str, list[Example]] = {r: [] for r in reasons}
    pages: dict[str, set] = {r: set() for r in reasons}
    seen: Counter = Counter()
    missing = {r for r, n in reasons.items() if n}
    for f in work.part_files("rejected"):
        if not missing:
            break
        pf = storage.parquet_file(f)
        columns = [c for c in COLUMNS if c in pf.schema_arrow.names]
        for row in pf.read(columns=columns).to_pylist():
            reason = row["reason"]
            if reason not in missing:
                continue
            seen[reason] += 1
            example = Example(reason, row.get("page_url"), row.get("image_url"), row.get("text"), row.get("detail"))
            page = row.get("page_url") or row.get("image_url") or row.get("text")
            if page not in pages[reason]:
                pages[reason].add(page)
                picked[reason].append(example)
            elif len(spare[reason]) < per_reason:
                spare[reason].append(example)
            if len(picked[reason]) >= per_reason or seen[reason] >= reasons[reason]:
                missing.discard(reason)
    out = {r: (picked[r] + spare[r])[:per_reason] for r in reasons}
    if thumbnails:
        urls = {e.image_url for examples in out.values() for e in examples if e.image_url}
        # An image stage 2 dropped as unsafe is blurred without asking the model again; every
        # other thumbnail is scored here (most were dropped before stage 2 scored them).
        unsafe = {e.image_url for e in out.get("filter/unsafe", ()) if e.image_url}
        thumbs = image_thumbnails(work, urls, unsafe)
        notes = fetch_notes(work, urls - set(thumbs))
        for examples in out.values():
            for e in examples:
                e.thumb, e.blurred = thumbs.get(e.image_url or "", (None, False))
                if e.image_url and not e.thumb:
                    e.image_note = notes.get(e.image_url, "no image: the URL was never fetched")
    return out


def fetch_notes(work: WorkDir, urls: set[str]) -> dict[str, str]:
    """image URL -> why the report shows no thumbnail of it (its fetch failed, or its bytes
    are no image Pillow draws), for the URLs `images/` holds."""
    if not urls or not work.part_files("images"):
        return {}
    out: dict[str, str] = {}
    for partition in sorted({partition_of(url, work.n_partitions) for url in urls}):
        for f in work.part_files("images", partition):
            t = storage.parquet_file(f).read(columns=["image_url", "status", "error"])
            for url, status, error in zip(*(t.column(c).to_pylist() for c in ("image_url", "status", "error"))):
                if url in urls and url not in out:
                    out[url] = (f"no image: HTTP {status}" + (f" ({error})" if error else "") + ", no bytes stored"
                                if error else "no thumbnail: the stored bytes are no image to draw (or too large)")
    return out


def image_thumbnails(work: WorkDir, urls: set[str], unsafe: set[str] = frozenset()
                     ) -> dict[str, tuple[str, bool]]:
    """image URL -> (JPEG data URI of a thumbnail, blurred?), for the URLs whose bytes `images/`
    stores; those in `unsafe` are blurred, the others when the unsafe model says so (or is not
    installed). Only the partitions that hold the URLs are read."""
    if not urls or not work.part_files("images"):
        return {}
    n = work.n_partitions
    by_partition: dict[int, set[str]] = {}
    for url in urls:
        by_partition.setdefault(partition_of(url, n), set()).add(url)
    out: dict[str, tuple[str, bool]] = {}
    limit = run_max_unsafe(work)
    for partition, wanted in sorted(by_partition.items()):
        for f in work.part_files("images", partition):
            pf = storage.parquet_file(f)
            for group in range(pf.num_row_groups):  # the bytes of a row group only when it has one
                names = pf.read_row_group(group, columns=["image_url"]).column(0).to_pylist()
                rows = [i for i, url in enumerate(names) if url in wanted and url not in out]
                if not rows:
                    continue
                data = pf.read_row_group(group, columns=["bytes"]).column(0)
                for i in rows:
                    thumb = thumbnail(data[i].as_py() or b"", punsafe=1.0 if names[i] in unsafe else None,
                                      max_unsafe=limit)
                    if thumb:
                        out[names[i]] = thumb
    return out


def thumbnail(data: bytes, side: int = THUMB, punsafe: float | None = None, max_unsafe: float | None = None
              ) -> tuple[str, bool] | None:
    """(JPEG data URI of `data` scaled to fit `side`, blurred?), or None when it is no image
    Pillow decodes within the pixel limit (a thumbnail must never cost the report). Blurred when
    `punsafe`, or the unsafe model's score when it is None, is above `max_unsafe` (the run's;
    the default max_unsafe when None)."""
    from PIL import Image

    from lait.filters.unsafe import DEFAULT_MAX_UNSAFE, MODEL_SIDE, thumbnail_uri

    max_unsafe = DEFAULT_MAX_UNSAFE if max_unsafe is None else max_unsafe

    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            if w * h > MAX_THUMB_PIXELS:
                return None
            im.draft("RGB", (MODEL_SIDE, MODEL_SIDE))  # the size the model looks at
            return thumbnail_uri(im.convert("RGB"), side, punsafe, max_unsafe=max_unsafe)
    except Exception as exc:  # any decoder error: the example shows its detail instead
        log.debug("no thumbnail: %r", exc)
        return None


def to_json(examples: dict[str, list[Example]]) -> dict[str, list[dict[str, Any]]]:
    return {r: [{"page_url": e.page_url, "image_url": e.image_url, "text": e.text, "detail": e.detail}
                for e in es] for r, es in examples.items()}
