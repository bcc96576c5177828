"""Site boilerplate by count over the whole pool of pages (issue 33): the stage-3 global step.

A text that a site puts beside the images of many of its pages (its name as a logo's alt, a
byline, a navigation label, "Opel - Opel") says nothing about any one picture. Stage 3 drops
it as `clean/site_boilerplate` because of that count, not because of what it says.

Pages are partitioned by page URL, so the pages of one site lie in every partition: counted
inside one partition, a site name on all 40 pages of a site reached about 40/16 pages in each
of 16 partitions, under `site_repeat_min_pages`, and was kept. This step reads the texts of
every page of the pool once before the partitions run (`CleanStage.global_steps`): the rows of
stage 3's extraction pass (`page_texts/`, `ExtractStage`), so that no page is parsed twice. It
counts for each site the pages on which each text may be offered to an image (`PageTexts.counted`:
each image's own texts, and the first and last sentences of the paragraphs near images, main
content or not; a count of more pages than stage 3 offers the text on, never fewer) and writes
to `site_texts/` the texts that reach the limit:
at least `site_repeat_min_pages` pages and `site_repeat_share` of the site's pages. Every
partition of stage 3 reads that small table; its fingerprint holds the step's, so a changed
count redoes the partitions. A page stage 3 rejects (not HTML, unparsable) has no row and
counts for nothing. A site is a host without a leading `www.`.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter, defaultdict
from typing import Any, Callable
from urllib.parse import urlsplit

import pyarrow as pa

from lait.fingerprint import global_fingerprint
from lait.parts import PartitionedWriter
from lait.schemas import get_table
from lait.stage import RunReport, run_global_step
from lait.workdir import WorkDir

# `cfg` below is stage 3's `CleanConfig` (not imported: `lait.filters.text_stage` imports this module).
CleanConfig = Any

log = logging.getLogger(__name__)

STEP = "clean_site_texts"  # the global step's marker: WORK/_done/clean_site_texts/p00000.json
VERSION = 2  # 2: read from the extraction pass (page_texts/), not from a parse of its own
TAG = "site_texts"
SITE_TEXTS = get_table("site_texts")  # the count's table (`lait.schemas`)

SiteCounts = dict[tuple[str, int], tuple[int, int]]  # (site, key) -> (pages with it, pages of the site)


def site_of(url: str) -> str:
    """The site of a page: its host, lower-cased, without a leading `www.`."""
    host = (urlsplit(url).hostname or "").lower()
    return host.removeprefix("www.")


def text_key(text: str) -> int:
    """A text as the count compares it (case and spacing folded), as a 64-bit hash: a
    pool's texts are counted without keeping them all in memory."""
    folded = " ".join(text.casefold().split())
    return int.from_bytes(hashlib.blake2b(folded.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                          "big", signed=True)


def step_settings(cfg: CleanConfig) -> dict[str, Any]:
    """The settings that change what the step keeps (what it counts is in `page_texts/`, whose
    parts' digests its fingerprint holds)."""
    return {k: getattr(cfg, k) for k in ("site_repeat_min_pages", "site_repeat_share")}


def count_site_texts(work: WorkDir, cfg: CleanConfig, fingerprint: str | None = None) -> dict[str, int]:
    """Count every page of `page_texts/` (its `counted` column) and write `site_texts/` (see the
    module docstring)."""
    pages: Counter[str] = Counter()
    counts: dict[str, Counter[int]] = defaultdict(Counter)
    spelled: dict[tuple[str, int], str] = {}  # kept from a text's second page on
    for p in work.partitions("page_texts"):
        for row in work.iter_rows("page_texts", p, columns=["page_url", "counted"], batch_size=1024):
            site = site_of(row["page_url"])
            pages[site] += 1
            seen = counts[site]
            for text in row["counted"]:
                k = text_key(text)
                seen[k] += 1
                if seen[k] == 2:
                    spelled[(site, k)] = text
    work.remove_parts("site_texts", TAG)
    n = 0
    with PartitionedWriter(work, TAG, extra_stats={"fingerprint": fingerprint}) as parts:
        for site, seen in sorted(counts.items()):
            limit = max(cfg.site_repeat_min_pages, cfg.site_repeat_share * pages[site])
            for k, c in seen.items():
                if c >= limit:
                    parts.write("site_texts", parts.partition_of(site), {
                        "site": site, "key": k, "text": spelled[(site, k)], "pages": c, "site_pages": pages[site]})
                    n += 1
    log.info("clean: %d texts repeated on many pages of their site, over %d sites and %d pages",
             n, len(pages), sum(pages.values()))
    return {"texts": n, "sites": len(pages), "pages": sum(pages.values())}


def site_texts_step(work: WorkDir, cfg: CleanConfig, *, force: bool = False, report: RunReport | None = None) -> None:
    """`site_texts/` over every page, redone when a `page_texts` part or a setting of the step changed."""
    fp = global_fingerprint(work, STEP, step_settings(cfg), ["page_texts"], version=VERSION)
    run_global_step(work, fp, lambda: count_site_texts(work, cfg, fp.digest),
                    label="clean: site texts", force=force, report=report)


def step_digest(work: WorkDir) -> str | None:
    """The fingerprint digest of the last finished count; None when it never ran."""
    marker = work.markers(STEP).get(0)
    return None if marker is None else (marker.get("fingerprint") or {}).get("digest")


def load_site_texts(work: WorkDir) -> SiteCounts:
    """The repeated texts of every site, as written by the step."""
    t = work.read("site_texts", columns=["site", "key", "pages", "site_pages"])
    cols = [t.column(c).to_pylist() for c in ("site", "key", "pages", "site_pages")]
    return {(s, k): (n, m) for s, k, n, m in zip(*cols)}
