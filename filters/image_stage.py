"""Stage 2, `lait filter`: image content filtering, images/ -> images_ok/.

Per image, cheapest test first, so most rejects cost no pixel decoding:

1. the fetch: a row whose `error` says why it has no bytes is dropped for that (`noai`,
   `status`, `not_image`, `download`, `empty`; see `lait.reasons.fetch_rule`), as is any
   status but 200; then empty bytes (`empty`) and the byte limit (`too_large`)
2. same bytes as an image already kept in this partition (`duplicate_sha256`)
3. sniffing and the header: `svg`, `not_an_image`, `decompression_bomb`, then the rule filters
   on the header alone: `format`, `animated`, `min_side`, `aspect_ratio`
4. reduced-scale decode (`truncated`, `corrupt`), the uninformative hook (`uninformative`),
   the unsafe model's probability above `max_unsafe` (`unsafe`; kept as `punsafe` otherwise)
5. perceptual duplicate of an image kept in this partition (`duplicate_phash`)
6. the stored bytes: the original JPEG, or a high-quality JPEG re-encode

Faces are not searched here: stage 5 searches the pictures it ships, at the size they ship
(`lait.build.faces`), so no search is spent on an image that no text, score or duplicate rule
lets through (issue 61).

With `dedup` on, duplicates are found within a partition (images are partitioned by URL), the
first in input order being kept. It is off by default: which copy survived then depended on the
crawl's row order (so `lait demo`'s samples did), and the dropped copy's texts from its own page
were lost. Stage 5 groups duplicates over the whole dataset instead, pools their texts and keeps
the largest copy (then the most referenced, then the URL): the same choice for any crawl order.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

# FilterConfig lived here before filters/config.py: the name stays importable from this module.
from lait.filters.config import DEFAULT_FORMATS, FilterConfig  # noqa: F401
from lait.filters.consent import c2pa_reservation, dmi_reservation, load_hash_list
from lait.filters.image_decode import (
    ImageHeader,
    ImageRejected,
    decode_for_pdq,
    decode_small,
    encode_for_storage,
    open_image,
    sniff,
)
from lait.filters.image_rights import file_rights
from lait.filters.unsafe import UnsafeScorer, decode_for_model
from lait.imagehash import phash_of
from lait.memory import media_heap
from lait.parts import PartContext
from lait.reasons import FETCH_RULES, fetch_rule
from lait.rules import Drop, Filter, KeepResult, first_rejection
from lait.stage import Stage
from lait.writers import helper_thread

log = logging.getLogger(__name__)

# Side of the colour thumbnails that confirm a phash match: coarse enough that two resizes of
# one picture agree at 1/8-scale decoding, fine enough that different pictures do not.
THUMB = 8


# -- one image as the rules read it ---------------------------------------------------------------


class ImageCandidate:
    """One images/ row as stage 2's rules read it: its bytes and their digest, and the decoded
    forms, each made when a rule first reads it (`header`: `open_image`; `preview`: the
    reduced-scale decode; `phash`, `thumb`), so that a row dropped early costs no decoding. Reading
    `header` or `preview` raises the decoders' ImageRejected."""

    def __init__(self, row: dict[str, Any], sha: str | None, max_pixels: int):
        self.row = row
        self.data = row.get("bytes")
        self.max_pixels = max_pixels
        self._sha = sha
        self._header: ImageHeader | None = None
        self._preview: Any = None
        self._phash: int | None = None
        self._thumb: np.ndarray | None = None
        self.punsafe: float | None = None  # the unsafe model's probability, once `UnsafeFilter` read it

    @property
    def sha(self) -> str:
        if self._sha is None:
            self._sha = hashlib.sha256(self.data).hexdigest()
        return self._sha

    @property
    def header(self) -> ImageHeader:
        if self._header is None:
            self._header = open_image(self.data, max_pixels=self.max_pixels)
        return self._header

    @property
    def preview(self) -> Any:
        if self._preview is None:
            self._preview = decode_small(self.header)
        return self._preview

    @property
    def phash(self) -> int:
        if self._phash is None:
            self._phash = phash_of(self.preview.image)
        return self._phash

    @property
    def thumb(self) -> np.ndarray:
        if self._thumb is None:
            self._thumb = thumb_of(self.preview.image)
        return self._thumb


# -- rule filters on the header ------------------------------------------------------------------


class FormatFilter(Filter):
    name = "format"

    def __init__(self, formats: list[str]):
        self.formats = frozenset(f.upper() for f in formats)

    def keep(self, c: ImageCandidate) -> KeepResult:
        rec = c.header
        return rec.format in self.formats or (False, f"{rec.format} not in {sorted(self.formats)}")


class AnimatedFilter(Filter):
    name = "animated"

    def keep(self, c: ImageCandidate) -> KeepResult:
        rec = c.header
        return rec.frames <= 1 or (False, f"{rec.frames} frames")


class MinSideFilter(Filter):
    name = "min_side"

    def __init__(self, min_side: int):
        self.min_side = min_side

    def keep(self, c: ImageCandidate) -> KeepResult:
        w, h = c.header.width, c.header.height
        return min(w, h) >= self.min_side or (False, f"{w}x{h}: shorter side < {self.min_side}")


class AspectRatioFilter(Filter):
    name = "aspect_ratio"

    def __init__(self, max_aspect: float):
        self.max_aspect = max_aspect

    def keep(self, c: ImageCandidate) -> KeepResult:
        rec = c.header
        ratio = max(rec.width, rec.height) / min(rec.width, rec.height)
        return ratio <= self.max_aspect or (False, f"{rec.width}x{rec.height}: ratio {ratio:.2f} > {self.max_aspect}")


def header_filters(cfg: FilterConfig) -> list[Filter]:
    out: list[Filter] = [FormatFilter(cfg.formats)]
    if cfg.animated == "reject":
        out.append(AnimatedFilter())
    return out + [MinSideFilter(cfg.min_side), AspectRatioFilter(cfg.max_aspect)]


# -- duplicates ------------------------------------------------------------------------------------


class NearDuplicateIndex:
    """Kept images of a partition: phash (uint64) and 8x8 RGB thumbnails, searched with numpy."""

    def __init__(self, max_distance: int, max_diff: float):
        self.max_distance = max_distance
        self.max_diff = max_diff
        self._hashes = np.zeros(64, np.uint64)
        self._thumbs = np.zeros((64, THUMB * THUMB * 3), np.uint8)
        self._urls: list[str] = []

    def find(self, phash: int, thumb: np.ndarray) -> tuple[str, int, float] | None:
        """(url, distance, diff) of the closest kept near-duplicate, or None."""
        n = len(self._urls)
        if n == 0:
            return None
        dist = np.bitwise_count(self._hashes[:n] ^ np.uint64(phash))
        near = np.flatnonzero(dist <= self.max_distance)
        if near.size == 0:
            return None
        diffs = np.abs(self._thumbs[near].astype(np.int16) - thumb.astype(np.int16)).mean(axis=1)
        best = int(np.argmin(diffs))
        if diffs[best] > self.max_diff:
            return None
        i = int(near[best])
        return self._urls[i], int(dist[i]), float(diffs[best])

    def add(self, url: str, phash: int, thumb: np.ndarray) -> None:
        n = len(self._urls)
        if n == len(self._hashes):
            self._hashes = np.concatenate([self._hashes, np.zeros_like(self._hashes)])
            self._thumbs = np.concatenate([self._thumbs, np.zeros_like(self._thumbs)])
        self._hashes[n] = phash
        self._thumbs[n] = thumb
        self._urls.append(url)


def thumb_of(image: Any) -> np.ndarray:
    from PIL import Image

    return np.asarray(image.resize((THUMB, THUMB), Image.Resampling.BOX), np.uint8).reshape(-1)


# -- the rules over one image ---------------------------------------------------------------------


class FetchedFilter(Filter):
    """A row the crawl stored no usable body for: its `error`'s rule (`lait.reasons.fetch_rule`),
    or `status` for any status but 200 or no bytes."""

    name = "status"
    rules = tuple(sorted(FETCH_RULES["images"]))

    def keep(self, c: ImageCandidate) -> KeepResult:
        row = c.row
        fetched = fetch_rule(row.get("error"), "images")
        if fetched is None and row.get("status") == 200 and c.data is not None:
            return True
        return (False, f"crawl status {row.get('status')}" + (f" ({row['error']})" if row.get("error") else "")
                + ("" if c.data is not None else ", no bytes"), fetched or "status")


@dataclass
class TooLargeFilter(Filter):
    max_bytes: int
    name: ClassVar[str] = "too_large"

    def keep(self, c: ImageCandidate) -> KeepResult:
        return len(c.data) <= self.max_bytes or (False, f"{len(c.data)} bytes > {self.max_bytes}")


@dataclass
class ExcludedHashFilter(Filter):
    """Bytes on the `--exclude-hashes` list (by sha256, or MD5 where the list has those); with
    `pdq`, a picture on the list's PDQ hashes (the reduced decode first, as for every pixel
    rule: a damaged file is `truncated` or `corrupt` by the same decoder with or without it)."""

    hashes: Any
    path: str
    pdq: bool = False
    name: ClassVar[str] = "excluded_hash"

    def keep(self, c: ImageCandidate) -> KeepResult:
        if self.pdq:
            _ = c.preview
            listed = self.hashes.match_pdq(decode_for_pdq(c.header))
        else:
            listed = self.hashes.match(c.data, c.sha)
        return not listed or (False, f"{listed} is on {self.path}")


@dataclass
class SameBytesFilter(Filter):
    """The same bytes as an image kept before it in the partition (`dedup`)."""

    kept_sha: dict[str, str]
    name: ClassVar[str] = "duplicate_sha256"

    def keep(self, c: ImageCandidate) -> KeepResult:
        return not (c.sha in self.kept_sha and c.data) or (False, f"same bytes as {self.kept_sha[c.sha]}")


class SniffFilter(Filter):
    """Bytes that are plainly no raster image (`lait.filters.image_decode.sniff`)."""

    name = "not_an_image"
    rules = ("empty", "not_an_image", "svg")

    def keep(self, c: ImageCandidate) -> KeepResult:
        sniffed = sniff(c.data, c.row.get("mime"))
        return sniffed is None or (False, sniffed[1], sniffed[0])


class ReservedFilter(Filter):
    """An image whose file reserves its use (IPTC DMI, or a C2PA training assertion)."""

    name = "dmi_reserved"

    def keep(self, c: ImageCandidate) -> KeepResult:
        header = c.header
        applist = getattr(header.image, "applist", None) if header.format in ("JPEG", "MPO") else None
        reserved = (dmi_reservation(header.image.info, c.data, header.format)
                    or c2pa_reservation(c.data, header.format, applist))
        return not reserved or (False, reserved)


@dataclass
class UninformativeFilter(Filter):
    """The uninformative hook (`lait.filters.uninformative`) on the reduced decode."""

    classifier: Any
    name: ClassVar[str] = "uninformative"

    def keep(self, c: ImageCandidate) -> KeepResult:
        flagged, detail = self.classifier.judge(c.preview)
        return not flagged or (False, f"{self.classifier.name}: {detail}")


@dataclass
class UnsafeFilter(Filter):
    """The unsafe model's probability over its `max_unsafe`; kept as the candidate's `punsafe`."""

    scorer: UnsafeScorer
    name: ClassVar[str] = "unsafe"

    def keep(self, c: ImageCandidate) -> KeepResult:
        c.punsafe = punsafe = self.scorer(decode_for_model(c.header.data, c.header.orientation))
        limit = self.scorer.max_unsafe
        return not punsafe > limit or (False, f"punsafe {punsafe:.4f} > max_unsafe {limit} ({self.scorer.name})")


@dataclass
class NearDuplicateFilter(Filter):
    """A perceptual duplicate of an image kept before it in the partition (`dedup`)."""

    near: NearDuplicateIndex
    name: ClassVar[str] = "duplicate_phash"

    def keep(self, c: ImageCandidate) -> KeepResult:
        dup = self.near.find(c.phash, c.thumb)
        return dup is None or (False, f"like {dup[0]} (phash distance {dup[1]}, thumbnail diff {dup[2]:.1f})")


# -- the stage -------------------------------------------------------------------------------------

HASH_BATCH = 64  # rows read per batch; a batch's sha256 digests are taken on a thread


def _sha256_hex(rows: list[dict[str, Any]], max_bytes: int) -> list[str | None]:
    """The hex sha256 of each row's bytes; None where there are none, more than max_bytes (such
    rows are dropped before anything needs it) or bytes hashlib refuses (`_one` hashes those
    itself, and rejects the row with the error)."""
    out: list[str | None] = []
    for row in rows:
        data = row.get("bytes")
        try:
            out.append(hashlib.sha256(data).hexdigest() if data is not None and len(data) <= max_bytes else None)
        except Exception:
            out.append(None)
    return out


def _with_sha256(rows: Iterator[dict[str, Any]], max_bytes: int,
                 helper: ThreadPoolExecutor) -> Iterator[tuple[dict[str, Any], str | None]]:
    """(row, hex sha256 of its bytes or None) for each row, in order.

    The digests are taken on the `helper` thread, a batch ahead of the caller: hashlib hashes
    without the GIL, so hashing a batch (300 MB of photos took 0.17 s) overlaps the decoding
    of the one before it, which Pillow also does without the GIL. One batch more of rows is
    held."""
    ahead: tuple[list[dict[str, Any]], Future] | None = None
    while True:
        batch = list(itertools.islice(rows, HASH_BATCH))
        if batch:
            queued = (batch, helper.submit(_sha256_hex, batch, max_bytes))
        if ahead is not None:
            yield from zip(ahead[0], ahead[1].result())
        if not batch:
            return
        ahead = queued


_CLASSIFIERS: dict[tuple[str, int], Any] = {}  # one per worker process
_HASH_LISTS: dict[tuple, Any] = {}  # (file, mtime, size) -> its HashList, read once per worker process


class ImageFilterStage(Stage):
    """Stage 2 of LAIT over one partition of `images/`; see the module docstring for the order."""

    name = "filter"
    input_table = "images"
    output_tables = ("images_ok",)
    # 2: the rights the image file declares (`rights`); 3: sha256 is the stored bytes' digest
    # (it was the fetched file's, so stage 5 took every re-encoded image for corrupt); 4: no
    # face search (stage 5 searches what ships).
    version = 4

    def __init__(self, cfg: FilterConfig):
        self.cfg = cfg
        self.hashes: Any = None  # the --exclude-hashes list, read when a partition starts
        self.unsafe: UnsafeScorer | None = None  # the unsafe model, loaded when a partition starts

    def _classifier(self) -> Any:
        from lait.filters.uninformative import load_classifier

        key = (self.cfg.uninformative, self.cfg.flat_max_colours)
        if key not in _CLASSIFIERS:
            _CLASSIFIERS[key] = load_classifier(self.cfg.uninformative, max_colours=self.cfg.flat_max_colours)
        return _CLASSIFIERS[key]

    def __getstate__(self) -> dict[str, Any]:  # sent to workers without the model: an onnxruntime
        return {**self.__dict__, "unsafe": None}  # session does not pickle, and each loads its own

    def _unsafe(self) -> UnsafeScorer | None:
        # Loaded when a partition starts, not in __init__: the stage object is sent to workers.
        return None if self.cfg.unsafe_model == "none" else UnsafeScorer(self.cfg.unsafe_model, self.cfg.max_unsafe)

    def _hash_list(self) -> Any:
        path = self.cfg.exclude_hashes
        if not path:
            return None
        st = os.stat(path)
        key = (path, st.st_mtime_ns, st.st_size)  # a list edited between two runs of one process
        if key not in _HASH_LISTS:
            _HASH_LISTS.clear()
            _HASH_LISTS[key] = load_hash_list(path)
        return _HASH_LISTS[key]

    def rules(self, kept_sha: dict[str, str], near: NearDuplicateIndex, classifier: Any) -> list[Filter]:
        """Stage 2's rules over an `ImageCandidate`, cheapest first (the module's docstring):
        every one a `Filter`, read by `first_rejection`. Only the decoders raise (`ImageRejected`
        from `open_image` and the reduced decode, as a candidate's `header` or `preview` is first
        read), for what they find in bytes they cannot return from. `kept_sha` and `near`: the
        partition's kept images, which the duplicate rules search."""
        cfg = self.cfg
        out: list[Filter] = [FetchedFilter(), TooLargeFilter(cfg.max_bytes)]
        if self.hashes:
            out.append(ExcludedHashFilter(self.hashes, cfg.exclude_hashes))
        if cfg.dedup:
            out.append(SameBytesFilter(kept_sha))
        out.append(SniffFilter())
        if cfg.obey_reservations:
            out.append(ReservedFilter())
        out += header_filters(cfg)  # on the header alone
        if self.hashes is not None and self.hashes.pdq is not None:
            out.append(ExcludedHashFilter(self.hashes, cfg.exclude_hashes, pdq=True))
        out.append(UninformativeFilter(classifier))
        if self.unsafe is not None:
            # Last of the pixel tests: the model costs more than every test before it together.
            out.append(UnsafeFilter(self.unsafe))
        if cfg.dedup:
            out.append(NearDuplicateFilter(near))
        return out

    def process(self, ctx: PartContext) -> None:
        cfg = self.cfg
        classifier = self._classifier()
        self.hashes = self._hash_list()
        self.unsafe = self._unsafe()
        kept_sha: dict[str, str] = {}
        near = NearDuplicateIndex(cfg.phash_distance, cfg.near_dup_max_diff)
        rules = self.rules(kept_sha, near, classifier)
        # One helper thread reads the next row group of images/, hashes the next batch of images
        # and writes the finished row groups of images_ok/, while this one decodes: Arrow,
        # hashlib and Pillow's decoder all work without the GIL. Outputs are the same as inline.
        with media_heap(), helper_thread("lait-filter") as helper, ctx.writing_behind(helper):
            self._process_rows(ctx, rules, kept_sha, near, helper)
            ctx.flush()  # the last row group of images_ok too

    def _process_rows(self, ctx: PartContext, rules: list[Filter], kept_sha: dict[str, str],
                      near: NearDuplicateIndex, helper: ThreadPoolExecutor) -> None:
        # Image bytes as views into the read row group: hashing and decoding need no copy, and
        # the part writer joins the kept ones into the output row group directly.
        rows = ctx.work.iter_rows("images", ctx.partition, batch_size=HASH_BATCH, views=True, read_ahead=helper)
        with contextlib.closing(rows), contextlib.closing(_with_sha256(rows, self.cfg.max_bytes, helper)) as hashed:
            self._filter_rows(ctx, hashed, rules, kept_sha, near)

    def _filter_rows(self, ctx: PartContext, hashed: Iterator[tuple[dict[str, Any], str | None]],
                     rules: list[Filter], kept_sha: dict[str, str], near: NearDuplicateIndex) -> None:
        for row, sha in hashed:
            ctx.count("in")
            try:
                out = self._one(row, rules, kept_sha, near, sha)
            except ImageRejected as rej:  # what a decoder found
                out = Drop(rej.rule, rej.detail)
            except Exception as exc:  # a codec bug on one image must not fail the partition
                log.warning("filter: %s: %r", row["image_url"], exc)
                ctx.reject("error", image_url=row["image_url"], page_url=row.get("page_url"),
                           detail=f"{type(exc).__name__}: {exc}")
                continue
            if isinstance(out, Drop):
                ctx.reject(out.rule, image_url=row["image_url"], page_url=row.get("page_url"), detail=out.detail)
                continue
            ctx.write("images_ok", out)
            if out["bytes"] is not row["bytes"]:
                ctx.count("reencoded")

    def _one(self, row: dict[str, Any], rules: list[Filter], kept_sha: dict[str, str],
             near: NearDuplicateIndex, sha: str | None = None) -> dict[str, Any] | Drop:
        """The images_ok row for one images row, or why the first of `rules` drops it (a
        decoder's ImageRejected propagates). `sha`: the hex sha256 of its bytes when already
        known."""
        cfg = self.cfg
        c = ImageCandidate(row, sha, cfg.max_pixels)
        dropped = first_rejection(rules, c)
        if dropped is not None:
            return dropped
        header, data = c.header, c.data
        phash = c.phash
        stored, _ = encode_for_storage(header, keep_max_bytes=cfg.keep_jpeg_max_bytes, quality=cfg.jpeg_quality)
        if cfg.dedup:
            kept_sha[c.sha] = row["image_url"]
            near.add(row["image_url"], phash, c.thumb)
        out = {k: row.get(k) for k in ("image_url", "page_url", "mime", "status", "fetched_at", "error")}
        # sha256 is the digest of the bytes stored, which stage 5 checks and ships; a re-encoded
        # file keeps its fetched digest beside it, for provenance and hash lists.
        stored_sha = c.sha if stored is data else hashlib.sha256(stored).hexdigest()
        out.update(bytes=stored, mime="image/jpeg", width=header.width, height=header.height,
                   format=header.format, sha256=stored_sha, fetched_sha256=c.sha, phash=f"{phash:016x}",
                   punsafe=c.punsafe,
                   face_bboxes=None, face_scores=None, rights=file_rights(header.image, data, header.format))
        return out
