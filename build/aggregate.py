"""Pass 2 of `lait build` (global): LAIT's image-text aggregation over the whole dataset.

1. Group image URLs that show the same picture: equal sha256, perceptual hashes within
   `phash_threshold` bits, and stage 4's embedding near-duplicate pairs. One group becomes at
   most one sample; its candidates are pooled from every copy, on every page.
2. Drop groups that carry too many distinct texts or sit on too many pages (logos, chrome).
3. Drop texts attached to too many groups (boilerplate such as "click to enlarge").
4. Pick the best text per group: highest score, ties broken by source priority, then text;
   the next distinct texts become alternatives.
5. Threshold by absolute score, then keep the top fraction (as DataComp does).
6. Assign shards deterministically: samples in the order their bytes lie in `images_ok/`
   (hash-of-URL order, so shards are already mixed), `samples_per_shard` per tar.

Every dropped image is recorded in `rejected/` as `build/RULE`; the plan goes to `build_plan/`.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from lait.build.config import BuildConfig
from lait.build.dedup import group_duplicates, hamming, phash_int
from lait.build.neardup import embedding_pairs
from lait.parts import PartitionedWriter, WorkDir

log = logging.getLogger(__name__)

PLAN_TAG = "build-plan"


def norm_text(text: str) -> str:
    """Texts that differ only in case and spacing are one text."""
    return " ".join(text.casefold().split())


class Cand(NamedTuple):
    """One (image, text) candidate as the global pass holds it: a tuple, with the strings that
    repeat across candidates (page URL, source, language, model) shared, so that the plan's
    memory grows by about 140 bytes per candidate plus its text."""

    text: str
    source: str
    lang: str | None
    score: float
    page_url: str
    model: str
    pretrained: str | None
    license: str | None = None  # the licence the page declares


@dataclass(slots=True)
class Image:
    """One image URL of `build_images/` (the global pass keeps only these small records)."""

    url: str
    sha256: str
    phash: int
    width: int
    height: int
    format: str
    src_file: str
    row_group: int
    row_index: int
    candidates: list[Cand]


@dataclass
class Group:
    """The images that show one picture, and what the rules decided about it."""

    members: list[Image]
    rep: Image
    candidates: list[Cand] = field(default_factory=list)  # ranked, one per distinct text
    pages: int = 0

    @property
    def score(self) -> float:
        return self.candidates[0].score


class RejectSink:
    """Writes the global pass's rejects into `rejected/`, partitioned by image URL."""

    def __init__(self, work: WorkDir):
        self.parts = PartitionedWriter(work, PLAN_TAG)
        self.counts: Counter[str] = Counter()

    def reject(self, rule: str, image: Image, *, text: str | None = None, page_url: str | None = None,
               detail: str | None = None) -> None:
        page_url = page_url or (image.candidates[0].page_url if image.candidates else None)
        reason = self.parts.reject(f"build/{rule}", self.parts.partition_of(image.url), image_url=image.url,
                                   page_url=page_url, text=text, detail=detail)
        self.counts[reason] += 1

    def close(self) -> None:
        self.parts.close()

    def abort(self) -> None:
        self.parts.abort()


def load_images(work: WorkDir) -> list[Image]:
    shared: dict[Any, Any] = {}
    share = shared.setdefault  # one object per distinct page URL, source, language, model

    def cands(rows: list[dict[str, Any]]) -> list[Cand]:
        return [Cand(c["text"], share(c["source"], c["source"]), share(c["lang"], c["lang"]), c["score"],
                     share(c["page_url"], c["page_url"]), share(c["model"], c["model"]),
                     share(c["pretrained"], c["pretrained"]), share(c.get("license"), c.get("license")))
                for c in rows]

    images = [
        Image(r["image_url"], r["sha256"], phash_int(r["phash"]), r["width"], r["height"],
              share(r["format"], r["format"]), share(r["src_file"], r["src_file"]), r["row_group"],
              r["row_index"], cands(r["candidates"]))
        for r in work.iter_rows("build_images", batch_size=1024)
    ]
    # Sorting makes every later step independent of partition and part order.
    images.sort(key=lambda im: im.url)
    return images


def _rank_key(priority: dict[str, int]):
    worst = len(priority)
    return lambda c: (-c.score, priority.get(c.source, worst), c.text, c.page_url)


def _rep_key(im: Image):
    # The largest copy is the best sample; among equal sizes the most referenced URL is the
    # canonical one; the URL itself makes the choice total.
    pages = len({c.page_url for c in im.candidates})
    return (-(im.width * im.height), -pages, -len(im.candidates), im.url)


def _duplicate_rule(im: Image, rep: Image, threshold: int) -> tuple[str, str]:
    if im.sha256 == rep.sha256:
        return "duplicate_sha256", f"same bytes as {rep.url}"
    if threshold >= 0 and hamming(im.phash, rep.phash) <= threshold:
        return "duplicate_phash", f"phash within {hamming(im.phash, rep.phash)} bits of {rep.url}"
    return "near_duplicate", f"same picture as {rep.url}"


def make_groups(work: WorkDir, images: list[Image], cfg: BuildConfig) -> list[Group]:
    pairs = embedding_pairs(work, {im.url: i for i, im in enumerate(images)}, [im.phash for im in images],
                            cfg.near_dup_max_phash) if cfg.use_embedding_dups else []
    index_groups = group_duplicates([im.sha256 for im in images], [im.phash for im in images],
                                    cfg.phash_threshold, pairs)
    groups = []
    for idx in index_groups:
        members = sorted((images[i] for i in idx), key=_rep_key)
        groups.append(Group(members, members[0]))
    groups.sort(key=lambda g: g.rep.url)
    return groups


def plan_build(work: WorkDir, cfg: BuildConfig) -> dict[str, Any]:
    """Decide every sample and write `build_plan/` and the rejects; returns the pass's counters."""
    work.remove_parts("rejected", PLAN_TAG)
    work.remove_parts("build_plan", PLAN_TAG)
    images = load_images(work)
    groups = make_groups(work, images, cfg)
    sink = RejectSink(work)
    try:
        reject_duplicates(groups, sink, cfg)
        alive = drop_crowded(groups, sink, cfg)
        generic = generic_texts(alive, cfg)
        ranked = rank_texts(alive, generic, sink, cfg)
        kept = apply_thresholds(ranked, sink, cfg)
        kept.sort(key=lambda g: (g.rep.src_file, g.rep.row_group, g.rep.row_index))
        n_shards = write_plan(work, kept, cfg)
    finally:
        sink.close()
    counters = dict(sorted(sink.counts.items()))
    counters.update({"build/groups": len(groups), "build/plan_images": len(images),
                     "build/planned": len(kept), "build/shards": n_shards,
                     "build/generic_texts_dropped": len(generic)})
    return counters


def reject_duplicates(groups: list[Group], sink: RejectSink, cfg: BuildConfig) -> None:
    """Step 1: every member of a group but its representative is a duplicate."""
    for g in groups:
        for im in g.members[1:]:
            rule, detail = _duplicate_rule(im, g.rep, cfg.phash_threshold)
            sink.reject(rule, im, detail=detail)


def drop_crowded(groups: list[Group], sink: RejectSink, cfg: BuildConfig) -> list[Group]:
    """Step 2: pool each group's candidates; drop pictures with too many texts or pages."""
    alive = []
    for g in groups:
        pooled = [c for im in g.members for c in im.candidates]
        texts = {norm_text(c.text) for c in pooled}
        g.pages = len({c.page_url for c in pooled})
        if cfg.max_texts_per_image and len(texts) > cfg.max_texts_per_image:
            sink.reject("too_many_texts", g.rep, detail=f"{len(texts)} distinct texts")
        elif cfg.max_pages_per_image and g.pages > cfg.max_pages_per_image:
            sink.reject("too_many_pages", g.rep, detail=f"on {g.pages} pages")
        else:
            g.candidates = pooled
            alive.append(g)
    return alive


def generic_texts(groups: list[Group], cfg: BuildConfig) -> set[str]:
    """Step 3: the (normalised) texts attached to more than `max_images_per_text` pictures."""
    if not cfg.max_images_per_text:
        return set()
    per_text = Counter(t for g in groups for t in {norm_text(c.text) for c in g.candidates})
    return {t for t, n in per_text.items() if n > cfg.max_images_per_text}


def rank_texts(groups: list[Group], generic: set[str], sink: RejectSink, cfg: BuildConfig) -> list[Group]:
    """Step 4: each group's candidates ranked, one per distinct non-generic text; a group left
    with none is dropped."""
    rank = _rank_key({s: i for i, s in enumerate(cfg.source_priority)})
    ranked = []
    for g in groups:
        best: dict[str, Cand] = {}
        for c in sorted(g.candidates, key=rank):
            t = norm_text(c.text)
            if t in generic:
                continue
            best.setdefault(t, c)
        dropped = {norm_text(c.text) for c in g.candidates} & generic
        g.candidates = list(best.values())
        if not g.candidates:
            sink.reject("generic_texts", g.rep, detail=f"all {len(dropped)} texts are on too many images")
            continue
        ranked.append(g)
    return ranked


def apply_thresholds(groups: list[Group], sink: RejectSink, cfg: BuildConfig) -> list[Group]:
    """Step 5: the absolute score threshold, then the top fraction (DataComp-style)."""
    kept = []
    for g in groups:
        if cfg.min_score is not None and g.score < cfg.min_score:
            sink.reject("min_score", g.rep, text=g.candidates[0].text,
                        page_url=g.candidates[0].page_url, detail=f"{g.score:.4f} < {cfg.min_score}")
        else:
            kept.append(g)
    if cfg.top_fraction < 1.0 and kept:
        kept.sort(key=lambda g: (-g.score, g.rep.url))
        n_keep = math.ceil(cfg.top_fraction * len(kept))
        for g in kept[n_keep:]:
            sink.reject("top_fraction", g.rep, text=g.candidates[0].text,
                        page_url=g.candidates[0].page_url,
                        detail=f"{g.score:.4f} below the top {cfg.top_fraction:g}")
        kept = kept[:n_keep]
    return kept


def key_width(samples_per_shard: int) -> int:
    return max(4, len(str(samples_per_shard - 1)))


def write_plan(work: WorkDir, kept: list[Group], cfg: BuildConfig) -> int:
    """`build_plan/`: partition N is shard N, committed as soon as it is full; returns the shard count."""
    width = key_width(cfg.samples_per_shard)
    shard = -1
    with PartitionedWriter(work, PLAN_TAG) as parts:
        for i, g in enumerate(kept):
            s, idx = divmod(i, cfg.samples_per_shard)
            if s != shard:
                if shard >= 0:
                    parts.commit("build_plan", shard)  # one shard's plan in memory at a time
                shard = s
            parts.write("build_plan", s, plan_row(f"{s:05d}{idx:0{width}d}", s, g, cfg))
    return shard + 1


def _cand_json(c: Cand) -> dict[str, Any]:
    return {"text": c.text, "source": c.source, "lang": c.lang,
            "score": round(float(c.score), 6), "page_url": c.page_url}


def plan_row(key: str, shard: int, g: Group, cfg: BuildConfig) -> dict[str, Any]:
    best, rep = g.candidates[0], g.rep
    meta = {
        "key": key,
        "url": rep.url,
        "page_url": best.page_url,
        "caption": best.text,
        "score": round(float(best.score), 6),
        "source": best.source,
        "lang": best.lang,
        "model": best.model,
        "pretrained": best.pretrained,
        "license": best.license,
        "width": rep.width,
        "height": rep.height,
        "original_format": rep.format,
        "sha256": rep.sha256,
        "phash": f"{rep.phash:016x}",
        "pages": g.pages,
        "duplicates": [im.url for im in g.members[1:]][:16],
        "alternatives": [_cand_json(c) for c in g.candidates[1:1 + cfg.n_alternatives]],
        "candidates": [_cand_json(c) for c in g.candidates[:cfg.max_candidates]],
        "status": "success",
    }
    return {"key": key, "shard": shard, "image_url": rep.url, "page_url": best.page_url,
            "caption": best.text, "source": best.source, "lang": best.lang,
            "score": best.score, "width": rep.width, "height": rep.height, "format": rep.format,
            "sha256": rep.sha256, "phash": f"{rep.phash:016x}", "src_file": rep.src_file,
            "row_group": rep.row_group, "row_index": rep.row_index,
            "n_candidates": len(g.candidates), "n_duplicates": len(g.members) - 1,
            "meta": json.dumps(meta, ensure_ascii=False, sort_keys=True)}
