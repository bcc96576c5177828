"""The funnel of a work directory: rows grouped by what they count, one unit per row.

Units: pages, images, image-page pairs (an image shown on a page: one per page it is on),
image-text pairs (a candidate text of such a pair) and samples. Within a unit the counts only go
down, and each row's share is of the unit's first row; a row says in one sentence what it counts.
Rejection reasons get their unit the same way (`reason_unit`), so `clean/no_text` reads as
image-page pairs, never against the images fetched.

Every row but a unit's first says what was dropped on the way to it (`FunnelRow.dropped`), by
reason, so that each step's count is the next step's count plus the rows dropped there. Most
drops are rejection reasons, split by step where one stage's rule can apply at two steps (a
page that was never stored, a page stored but unreadable); a few are not rows of `rejected/`
but follow from the tables (an image whose texts all went in stage 3 has nothing to score):
those are named in `DERIVED` and counted from the tables, never as a difference of two rows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

from lait import storage
from lait.workdir import WorkDir, partition_of

PAGES, IMAGES, PAGE_PAIRS, TEXT_PAIRS, SAMPLES, DOCUMENTS = ("pages", "images", "image-page pairs",
                                                             "image-text pairs", "samples", "documents")
UNITS = (PAGES, IMAGES, PAGE_PAIRS, TEXT_PAIRS, SAMPLES, DOCUMENTS)
# The rules of `lait documents` by the step they drop at: stage 3's pass, stage 5's rules.
DOCUMENT_PAGE_RULES = ("documents/no_text", "documents/language", "documents/error")


@dataclass
class FunnelRow:
    """One step of one unit: how many there are, and of how many (the unit's first row)."""

    unit: str
    step: str
    count: int
    meaning: str
    base: int | None = None  # the count the share is of; None for a unit's first row
    base_label: str = ""
    # what was dropped between the previous row and this one: reason (or a DERIVED name) -> rows
    dropped: dict[str, int] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.unit} {self.step}"

    @property
    def percent(self) -> float | None:
        if self.base is None:
            return None
        return 100.0 * self.count / self.base if self.base else 0.0

    def share(self) -> str:
        """`46.1% of images fetched`, or "" for a unit's first row."""
        p = self.percent
        return "" if p is None else f"{p:.1f}% of {self.base_label}"

    def to_json(self) -> dict[str, Any]:
        return {"unit": self.unit, "step": self.step, "count": self.count,
                "percent": None if self.percent is None else round(self.percent, 2), "of": self.base_label or None,
                "dropped": dict(self.dropped)}


# Drops that are no row of rejected/: what happened, in one sentence.
NO_TEXT_LEFT = "no text left"
IMAGE_NOT_KEPT = "image not kept by filter"
OTHER_TEXTS = "not the caption"
IMAGE_DROPPED = "image dropped by build"
DERIVED = {
    NO_TEXT_LEFT: "images that passed stage 2 with no text left to score: every page showing them lost all "
                  "its texts in stage 3 (clean/no_text, counted there per page).",
    IMAGE_NOT_KEPT: "texts of images stage 2 rejected or never downloaded (their reasons are counted under "
                    "images): there are no bytes to score them against.",
    OTHER_TEXTS: "the other scored texts of an image that has a caption: a sample keeps one text per image, "
                 "its best.",
    IMAGE_DROPPED: "the best texts of images stage 5 dropped (build/* reasons, counted under images).",
}


def _null_count(work: WorkDir, table: str, column: str) -> int:
    """Rows of `table` whose `column` is null (the stored ones, for `error`)."""
    n = 0
    for f in work.part_files(table):
        pf = storage.parquet_file(f)
        if column in pf.schema_arrow.names:
            n += pf.read(columns=[column]).column(0).null_count
        else:
            n += pf.metadata.num_rows
    return n


def _list_lengths(work: WorkDir, table: str, column: str) -> int:
    """The sum of the lengths of a list column."""
    import pyarrow.compute as pc

    n = 0
    for f in work.part_files(table):
        lengths = pc.list_value_length(storage.parquet_file(f).read(columns=[column]).column(0))
        n += int(pc.sum(lengths).as_py() or 0)
    return n


def reason_unit(reason: str, row: dict[str, Any]) -> str:
    """What one row of a reason counts, from the row (a text: an image-text pair; an image
    without a page context: an image; ...)."""
    if reason == "clean/no_text":
        return PAGE_PAIRS
    if reason.startswith("documents/"):
        return DOCUMENTS
    if reason.startswith("build/") and reason != "build/no_image":
        # every other rule of stage 5 drops a picture; a row may name its best text (a score
        # cut, an unreadable image), but the picture is what goes
        return IMAGES
    if row.get("text") is not None:
        return TEXT_PAIRS
    if row.get("image_url"):
        return IMAGES
    if row.get("page_url"):
        return PAGES
    return "records"


def _unit_rows(unit: str, steps: list[tuple[str, int | None, str]]) -> list[FunnelRow]:
    """The rows of one unit that have a count (a stage that has not run has none)."""
    rows = [FunnelRow(unit, step, n, meaning) for step, n, meaning in steps if n is not None]
    for row in rows[1:]:
        row.base, row.base_label = rows[0].count, rows[0].label
    return rows


def _lookup(work: WorkDir, table: str, column: str, urls: set[str]) -> dict[str, bool]:
    """url -> whether its row in `table` has an `error`, for those of `urls` the table holds;
    only the partitions that hold them are read (pages by page URL, images by image URL)."""
    import pyarrow.compute as pc

    out: dict[str, bool] = {}
    for partition in sorted({partition_of(u, work.n_partitions) for u in urls}):
        for f in work.part_files(table, partition):
            t = storage.parquet_file(f).read(columns=[column, "error"])
            for url, failed in zip(t.column(column).to_pylist(), pc.is_valid(t.column("error")).to_pylist()):
                if url in urls:
                    out[url] = failed
    return out


def _rejected_rows(work: WorkDir) -> Iterator[dict[str, Any]]:
    """Each rejected row's reason, image and page URL, and whether it has a text (the text
    itself is never turned into Python: a table of millions of them stays in Arrow)."""
    import pyarrow.compute as pc

    for f in work.part_files("rejected"):
        pf = storage.parquet_file(f)
        names = pf.schema_arrow.names
        columns = [c for c in ("reason", "image_url", "page_url", "text") if c in names]
        t = pf.read(columns=columns)
        values = {c: t.column(c).to_pylist() for c in columns if c != "text"}
        has_text = pc.is_valid(t.column("text")).to_pylist() if "text" in names else [False] * t.num_rows
        for i, text in enumerate(has_text):
            yield {**{c: v[i] for c, v in values.items()}, "text": "" if text else None}


def _derived(work: WorkDir, add) -> None:
    """The drops that are no rows of rejected/, counted partition by partition (images_ok,
    candidates and scored are all partitioned by image URL, so each partition joins alone)."""
    import pyarrow.compute as pc

    parts = sorted(set(work.partitions("images_ok")) | set(work.partitions("scored"))
                   | set(work.partitions("candidates")))
    for p in parts:
        kept = set(work.read("images_ok", p, columns=["image_url"]).column(0).to_pylist())
        scored = work.read("scored", p, columns=["image_url"]).column(0).to_pylist()
        add(IMAGES, "with scored texts", NO_TEXT_LEFT, len(kept - set(scored)))
        add(TEXT_PAIRS, "kept as captions", OTHER_TEXTS, len(scored) - len(set(scored)))
        for f in work.part_files("candidates", p):
            t = storage.parquet_file(f).read(columns=["image_url", "texts"])
            lengths = pc.list_value_length(t.column("texts")).to_pylist()
            add(TEXT_PAIRS, "scored", IMAGE_NOT_KEPT,
                sum(n or 0 for url, n in zip(t.column("image_url").to_pylist(), lengths) if url not in kept))


def drops(work: WorkDir, has: dict[str, bool]) -> dict[tuple[str, str], Counter]:
    """(unit, step) -> what was dropped on the way to that step, by reason: every row of
    rejected/ lands at one step, by its stage, its unit and whether its page or image was
    stored; the derived drops are counted from the tables."""
    out: dict[tuple[str, str], Counter] = {}

    def add(unit: str, step: str, reason: str, n: int = 1) -> None:
        if n:
            out.setdefault((unit, step), Counter())[reason] += n

    # Rows whose step depends on their page's or image's row: looked up after one pass.
    crawl_pages: list[tuple[str, str]] = []
    clean_pages: list[tuple[str, str]] = []
    filter_images: list[tuple[str, str]] = []
    for row in _rejected_rows(work):
        reason = row["reason"]
        stage = reason.split("/", 1)[0]
        unit = reason_unit(reason, row)
        if unit == PAGES and stage in ("crawl", "ingest"):
            crawl_pages.append((reason, row.get("page_url")))
        elif unit == PAGES and stage == "clean":
            clean_pages.append((reason, row.get("page_url")))
        elif unit == IMAGES and stage == "filter":
            filter_images.append((reason, row.get("image_url")))
        elif unit == IMAGES and stage == "build":
            add(IMAGES, "in shards", reason)
            add(TEXT_PAIRS, "kept as captions", IMAGE_DROPPED)
        elif reason == "clean/no_text":
            add(PAGE_PAIRS, "with texts", reason)
        elif unit == TEXT_PAIRS and stage == "clean":
            add(TEXT_PAIRS, "kept by clean", reason)
        elif unit == DOCUMENTS:
            add(DOCUMENTS, "with main text" if reason in DOCUMENT_PAGE_RULES else "written", reason)
        elif unit == TEXT_PAIRS and stage in ("score", "build"):
            add(TEXT_PAIRS, "scored" if stage == "score" else "kept as captions", reason)
    pages = _lookup(work, "pages", "url", {u for _, u in crawl_pages + clean_pages if u}) if has["pages"] else {}
    for reason, url in crawl_pages:
        if url not in pages:  # found, never fetched (robots.txt, a refused host, ...); a stored page
            add(PAGES, "fetched", reason)  # flagged by the crawl (too deep) is no drop
    for reason, url in clean_pages:
        add(PAGES, "stored" if pages.get(url or "") else "read", reason)
    images = _lookup(work, "images", "image_url", {u for _, u in filter_images if u}) if has["images"] else {}
    for reason, url in filter_images:
        add(IMAGES, "downloaded" if images.get(url or "") else "kept by filter", reason)
    if has["images_ok"] and has["scored"]:
        _derived(work, add)
    return out


def funnel(work: WorkDir, rejects: Counter, units: dict[str, str], samples: int | None,
           documents: int | None = None) -> list[FunnelRow]:
    """The funnel rows of a work directory, unit by unit: `rejects` counts the rows of each
    reason, `units` says what each reason counts, `samples` is None without shards, `documents`
    the documents `lait documents` wrote (None when it has not)."""
    has = {t: bool(work.part_files(t)) for t in ("pages", "images", "images_ok", "candidates", "scored",
                                                  "build_images", "doc_pages")}
    count = {t: work.count(t) if present else None for t, present in has.items()}
    # Stage 3 rejects a page at most once, whatever the cause (no HTML, unparsable, too deep, ...).
    page_rejects = sum(n for r, n in rejects.items() if r.startswith("clean/") and units.get(r) == PAGES)
    no_text = rejects.get("clean/no_text", 0)
    dropped = drops(work, has)
    not_fetched = sum(dropped.get((PAGES, "fetched"), Counter()).values())
    out: list[FunnelRow] = []
    out += _unit_rows(PAGES, [
        ("found", count["pages"] + not_fetched if has["pages"] else None,
         "page URLs the crawl or the archive ingest found: those it fetched and those it was not allowed to "
         "fetch (robots.txt, a refused host, ...)."),
        ("fetched", count["pages"], "pages/ rows: every page URL the crawl or the archive ingest fetched, "
                                    "whatever it answered."),
        ("stored", _null_count(work, "pages", "error") if has["pages"] else None,
         "pages whose HTML was stored: an HTML answer with status 2xx and no noai opt-out."),
        ("read", count["pages"] - page_rejects if has["candidates"] and has["pages"] else None,
         "pages stage 3 read whole: the stored ones, less those it could not parse, read in time or "
         "read to the end."),
    ])
    out += _unit_rows(IMAGES, [
        ("fetched", count["images"], "images/ rows: every image URL requested (once, whatever the number of "
                                     "pages showing it), whatever it answered."),
        ("downloaded", _null_count(work, "images", "error") if has["images"] else None,
         "images whose bytes were stored: status 2xx, an image content type, no noai opt-out."),
        ("kept by filter", count["images_ok"], "images that decoded and passed stage 2: size, aspect ratio, "
                                               "format, exact and perceptual duplicates."),
        ("with scored texts", count["build_images"], "images with at least one scored text, as stage 5 "
                                                     "starts grouping them."),
        ("in shards", samples, "images written to the shards, after grouping, deduplication and score "
                               "thresholds: one per sample."),
    ])
    out += _unit_rows(PAGE_PAIRS, [
        ("found", count["candidates"] + no_text if has["candidates"] else None,
         "(page, image) pairs stage 3 found: an image shown on a page, once per page it is on, whether or "
         "not the image passed stage 2."),
        ("with texts", count["candidates"], "pairs that kept at least one candidate text after cleaning "
                                            "(candidates/ rows)."),
    ])
    kept_texts = _list_lengths(work, "candidates", "texts") if has["candidates"] else None
    text_rejects = sum(n for r, n in rejects.items() if r.startswith("clean/") and units.get(r) == TEXT_PAIRS)
    out += _unit_rows(TEXT_PAIRS, [
        ("offered", None if kept_texts is None else kept_texts + text_rejects,
         "texts stage 3 found for an image on a page (alt, title, figcaption, og, context), before its "
         "rules: one per page, image and text."),
        ("kept by clean", kept_texts, "those texts that passed stage 3's rules (language, length, "
                                      "boilerplate, file names, ...)."),
        ("scored", count["scored"], "texts scored against their image by stage 4 (scored/ rows); only "
                                    "images kept by the filter have bytes to score."),
        ("kept as captions", samples, "the texts that became the captions of the samples: one per sample."),
    ])
    doc_pages = count["doc_pages"]
    out += _unit_rows(DOCUMENTS, [
        ("pages read", None if doc_pages is None else doc_pages + sum(rejects.get(r, 0) for r in DOCUMENT_PAGE_RULES),
         "stored pages stage 3's document pass read (`lait documents`)."),
        ("with main text", doc_pages, "pages with a main text in a kept language: the documents before "
                                      "stage 5's rules (doc_pages/ rows)."),
        ("written", documents if doc_pages is not None else None,
         "documents written to WORK/documents/ (MMC4 tars, OBELICS Parquet), each with at least one picture."),
    ])
    for row in out:
        if row.base is not None:
            row.dropped = dict(dropped.get((row.unit, row.step), Counter()).most_common())
    if samples is not None:
        base = count["images"]
        out.append(FunnelRow(SAMPLES, "in shards", samples, "samples in the shards (WebDataset tars): an image, "
                             "its caption and its metadata.", base, "images fetched" if base is not None else ""))
    return out
