"""Pass 2 of `lait build` (global): LAIT's image-text aggregation over the whole dataset.

1. Group image URLs that show the same picture: equal sha256, and the pairs that perceptual
   hashes within `phash_threshold` bits or stage 4's embeddings propose when a pixel check
   confirms them (`lait.build.pixels`). One group becomes at most one sample; its candidates
   are pooled from every copy, on every page.
   With `--exclude-eval`, a group any of whose images shows a picture of the evaluation set
   (`lait.build.decon`) is dropped whole, every image of it as `build/eval_overlap`.
2. Drop groups that carry too many distinct texts or sit on too many pages (logos, chrome).
   The texts of a group's other copies then move to its kept image only scored against that
   image (`lait.build.rescore`): a sample's score is always its own image's and caption's cosine.
3. Drop texts attached to too many groups (boilerplate such as "click to enlarge").
4. Pick the best text per group: highest score, ties broken by source priority, then text;
   the next distinct texts follow it in the sample's candidates.
5. Write the pool (`pool/`): every picture that passed 1-4, with its planned sample and uid;
   `lait select` cuts other subsets from it without rescoring.
6. Threshold by absolute score, then keep the top fraction (as DataComp does).
7. Assign shards deterministically from the pool: samples in the order their bytes lie in
   `images_ok/` (hash-of-URL order, so shards are already mixed), `samples_per_shard` per tar.

Every dropped image is recorded in `rejected/` as `build/RULE`; the plan goes to `build_plan/`.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lait import storage
from lait.build.books import ListBook, failures, input_key, load_book
from lait.build.config import BuildConfig
from lait.build.dedup import group_duplicates, hamming, phash_int
from lait.build.neardup import embedding_pairs
from lait.build.pixels import PixelCheck, read_thumbnails
from lait.build.rescore import rescore_groups
from lait.build.sample import punsafe_value, sample_uid
from lait.parts import PartitionedWriter
from lait.schemas import get_table
from lait.workdir import WorkDir, partition_of

log = logging.getLogger(__name__)

PLAN_TAG = "build-plan"
EXTRA_COLUMNS = "_extra_columns"  # among the plan's counters: the list's extra columns and their types
POOL = get_table("pool").schema


def norm_text(text: str) -> str:
    """Texts that differ only in case and spacing are one text."""
    return " ".join(text.casefold().split())


def _norm(text: str) -> str:
    norm = norm_text(text)
    return text if norm == text else norm  # no second copy of a text that is already normal


class Cand(NamedTuple):
    """One (image, text) candidate as the global pass holds it: a tuple, with the strings that
    repeat across candidates (page URL, source, language, model) shared, so that the plan's
    memory grows by about 150 bytes per candidate plus its text (and its normal form when that differs)."""

    text: str
    source: str
    lang: str | None
    score: float
    page_url: str
    model: str
    pretrained: str | None
    license: str | None  # the licence the page declares
    image_license: str | None  # the licence the page declares for this image (its figure's)
    norm: str  # `norm_text(text)`, worked out once (the rules compare texts by it); `text` itself when equal


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
    punsafe: float | None = None  # stage 2's; None: not scored
    face_bboxes: list[list[float]] | None = None  # stage 2's; None: not searched
    rights: str | None = None  # what the image file declares (stage 2); None: nothing
    fetched_sha256: str | None = None  # of the file as fetched (stage 2); None: sha256 is that too

    @property
    def fetched_digest(self) -> str:
        """The SHA-256 of the file as fetched (provenance, hash lists): `sha256` is the stored
        bytes' digest, the same unless stage 2 re-encoded the file."""
        return self.fetched_sha256 or self.sha256


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
        self.first: dict[str, tuple[str, str | None]] = {}  # URL -> its first (reason, detail): the books

    def reject(self, rule: str, image: Image, *, text: str | None = None, page_url: str | None = None,
               detail: str | None = None) -> None:
        page_url = page_url or (image.candidates[0].page_url if image.candidates else None)
        reason = self.parts.reject(f"build/{rule}", self.parts.partition_of(image.url), image_url=image.url,
                                   page_url=page_url, text=text, detail=detail)
        self.counts[reason] += 1
        self.first.setdefault(image.url, (reason, detail))

    def close(self) -> None:
        self.parts.close()

    def abort(self) -> None:
        self.parts.abort()


IMAGE_COLUMNS = ["image_url", "sha256", "phash", "width", "height", "format", "punsafe", "src_file", "row_group",
                 "row_index", "face_bboxes", "rights", "fetched_sha256"]
CAND_FIELDS = ["text", "source", "lang", "score", "page_url", "model", "pretrained", "license", "image_license"]


def load_images(work: WorkDir) -> list[Image]:
    """Every row of `build_images/` as a small `Image` record, sorted by URL.

    Read a row group at a time column by column (a list per column, the candidates flattened
    once per group): converting rows with nested candidates to dicts one by one cost three
    times as much."""
    shared: dict[Any, Any] = {}
    share = shared.setdefault  # one object per distinct page URL, source, language, model
    images = []
    for f in work.part_files("build_images"):
        pf = storage.parquet_file(f)
        for rg in range(pf.num_row_groups):
            group = pf.read_row_group(rg)
            # punsafe is missing from build_images/ written before it existed: not scored.
            cols = [group.column(c).to_pylist() if c in group.column_names else [None] * group.num_rows
                    for c in IMAGE_COLUMNS]
            cands_col = group.column("candidates").combine_chunks()
            offsets = cands_col.offsets.to_pylist()
            values = cands_col.flatten()  # the candidates of this group's rows, sliced as they are
            by_name = dict(zip((values.type.field(i).name for i in range(values.type.num_fields)),
                               values.flatten()))
            fields = [by_name[name].to_pylist() if name in by_name else [None] * len(values)
                      for name in CAND_FIELDS]
            cands = [Cand(text, share(source, source), share(lang, lang), score, share(page, page),
                          share(model, model), share(pre, pre), share(lic, lic), ilic, _norm(text))
                     for text, source, lang, score, page, model, pre, lic, ilic in zip(*fields)]
            for i, (url, sha, ph, w, h, fmt, unsafe, src, grp, idx, faces, rights, fetched) in enumerate(zip(*cols)):
                images.append(Image(url, sha, phash_int(ph), w, h, share(fmt, fmt), share(src, src), grp, idx,
                                    cands[offsets[i] - offsets[0]:offsets[i + 1] - offsets[0]], unsafe, faces,
                                    rights, None if fetched == sha else fetched))
            del group
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
    phashes = [im.phash for im in images]
    pairs = embedding_pairs(work, {im.url: i for i, im in enumerate(images)}, phashes,
                            cfg.near_dup_max_phash) if cfg.use_embedding_dups else []
    check = PixelCheck(work, [(im.src_file, im.row_group, im.row_index) for im in images], cfg.near_dup_max_diff)
    index_groups = group_duplicates([im.sha256 for im in images], phashes, cfg.phash_threshold, pairs, check)
    if check.confirmed or check.refused:
        log.info("build: the pixel check confirmed %d proposed duplicate pairs and refused %d (a cell of the "
                 "thumbnails more than %g apart)", check.confirmed, check.refused, cfg.near_dup_max_diff)
    groups = []
    for idx in index_groups:
        members = sorted((images[i] for i in idx), key=_rep_key)
        groups.append(Group(members, members[0]))
    groups.sort(key=lambda g: g.rep.url)
    return groups


def plan_build(work: WorkDir, cfg: BuildConfig) -> dict[str, Any]:
    """Decide every sample and write `build_plan/` and the rejects; returns the pass's counters."""
    for table in ("rejected", "build_plan", "pool", "build_failed"):
        work.remove_parts(table, PLAN_TAG)
    book = load_book(work, cfg.samples_per_shard)
    images = load_images(work)
    overlaps, n_eval = eval_overlaps(work, images, cfg)
    groups = make_groups(work, images, cfg)
    sink = RejectSink(work)
    try:
        groups = reject_eval_overlaps(groups, overlaps, sink)
        reject_duplicates(groups, sink, cfg)
        alive = drop_crowded(groups, sink, cfg)
        moved = rescore_groups(work, alive)
        generic = generic_texts(alive, cfg)
        ranked = rank_texts(alive, generic, sink, cfg)
        pool = write_pool(work, pool_table(ranked, cfg, book))
        kept = {g.rep.url for g in apply_thresholds(ranked, sink, cfg)}
        chosen = (t.filter(pa.array([u in kept for u in t.column("image_url").to_pylist()], pa.bool_()))
                  for t in pool)
        if cfg.key_order == "input":
            n_shards, per_shard = write_plan_by_input(work, chosen, cfg.samples_per_shard, book)
        else:
            n_shards = write_plan(work, chosen, cfg.samples_per_shard)
            per_shard = {s: min(cfg.samples_per_shard, len(kept) - s * cfg.samples_per_shard) for s in range(n_shards)}
    finally:
        sink.close()
    failed = write_failures(work, book, kept, sink.first, cfg, per_shard) if book is not None else []
    counters = dict(sorted({**sink.counts, **moved}.items()))
    if book is not None:
        counters["build/list_rows"] = len(book.rows)
        counters["build/list_rows_failed"] = len(failed)
        counters["build/shards"] = n_shards = max(n_shards, 1 + max((f["shard"] for f in failed), default=-1))
        counters[EXTRA_COLUMNS] = book.extra_types
    counters.update({"build/groups": len(groups), "build/plan_images": len(images),
                     "build/pool": len(ranked), "build/planned": len(kept), "build/shards": n_shards,
                     "build/generic_texts_dropped": len(generic)})
    if cfg.exclude_eval:
        counters["build/eval_images"] = n_eval
    return counters


def eval_overlaps(work: WorkDir, images: list[Image], cfg: BuildConfig) -> tuple[dict[str, str], int]:
    """The URLs of the images that show a picture of the `--exclude-eval` set, each with why
    (`lait.build.decon`), and the number of images in the set (none without the flag)."""
    if not cfg.exclude_eval:
        return {}, 0
    from lait.build.decon import detail_of, find_overlaps, load_eval_set

    eval_set = load_eval_set(cfg.exclude_eval, cfg.exclude_eval_split, cfg.exclude_eval_root)
    places = [(im.src_file, im.row_group, im.row_index) for im in images]
    found = find_overlaps(eval_set, np.array([im.phash for im in images], np.uint64),
                          lambda idx: read_thumbnails(work, {i: places[i] for i in idx}, detail_of),
                          cfg.eval_max_phash, cfg.eval_max_diff)
    return {images[i].url: o.detail() for i, o in found.items()}, len(eval_set)


def reject_eval_overlaps(groups: list[Group], overlaps: dict[str, str], sink: RejectSink) -> list[Group]:
    """Step 1, before duplicates: a group with an image of the evaluation set is dropped whole,
    each of its images as `build/eval_overlap` (a copy grouped with a copy is one too, even when
    it is itself further from the evaluation image than the search reaches)."""
    if not overlaps:
        return groups
    kept = []
    for g in groups:
        hits = [im.url for im in g.members if im.url in overlaps]
        if not hits:
            kept.append(g)
            continue
        for im in g.members:
            sink.reject("eval_overlap", im,
                        detail=overlaps.get(im.url) or f"same picture as {hits[0]}, {overlaps[hits[0]]}")
    return kept


def reject_duplicates(groups: list[Group], sink: RejectSink, cfg: BuildConfig) -> None:
    """Step 1: every member of a group but its representative is a duplicate."""
    for g in groups:
        for im in g.members[1:]:
            rule, detail = _duplicate_rule(im, g.rep, cfg.phash_threshold)
            sink.reject(rule, im, detail=detail)


def drop_crowded(groups: list[Group], sink: RejectSink, cfg: BuildConfig) -> list[Group]:
    """Step 2: pool each group's candidates; drop pictures with too many texts or pages. The
    pooled candidates count texts and pages; `rescore_groups` then decides which texts move."""
    alive = []
    for g in groups:
        pooled = [c for im in g.members for c in im.candidates]
        texts = {c.norm for c in pooled}
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
    per_text = Counter(t for g in groups for t in {c.norm for c in g.candidates})
    return {t for t, n in per_text.items() if n > cfg.max_images_per_text}


def rank_texts(groups: list[Group], generic: set[str], sink: RejectSink, cfg: BuildConfig) -> list[Group]:
    """Step 4: each group's candidates ranked, one per distinct non-generic text; a group left
    with none is dropped."""
    rank = _rank_key({s: i for i, s in enumerate(cfg.source_priority)})
    ranked = []
    for g in groups:
        best: dict[str, Cand] = {}
        for c in sorted(g.candidates, key=rank):
            t = c.norm
            if t in generic:
                continue
            best.setdefault(t, c)
        dropped = {c.norm for c in g.candidates} & generic
        g.candidates = list(best.values())
        if not g.candidates:
            sink.reject("generic_texts", g.rep, detail=f"all {len(dropped)} texts are on too many images")
            continue
        ranked.append(g)
    return ranked


def score_cut(scores: np.ndarray, urls: list[str] | pa.Array | pa.ChunkedArray, min_score: float | None,
              top_fraction: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which pictures the score thresholds keep: the absolute `min_score`, then the best
    `top_fraction` of the rest (rounded up; equal scores ordered by URL). Returns the indices
    kept (in input order), below min_score (in input order) and beyond the top fraction (best
    first). `lait build` and `lait select` cut with this one function."""
    scores = np.asarray(scores, np.float64)
    below = np.flatnonzero(scores < min_score) if min_score is not None else np.zeros(0, np.int64)
    rest = np.setdiff1d(np.arange(len(scores)), below)
    cut = np.zeros(0, np.int64)
    if top_fraction < 1.0 and len(rest):
        urls = urls if isinstance(urls, (pa.Array, pa.ChunkedArray)) else pa.array(urls, pa.string())
        table = pa.table({"score": scores[rest], "url": urls.take(pa.array(rest, pa.int64()))})
        order = rest[pc.sort_indices(table, sort_keys=[("score", "descending"), ("url", "ascending")]).to_numpy()]
        n_keep = math.ceil(top_fraction * len(rest))
        rest, cut = np.sort(order[:n_keep]), order[n_keep:]
    return rest, below, cut


def apply_thresholds(groups: list[Group], sink: RejectSink, cfg: BuildConfig) -> list[Group]:
    """Step 6: the absolute score threshold, then the top fraction (DataComp-style)."""
    kept, below, cut = score_cut(np.array([g.score for g in groups], np.float64), [g.rep.url for g in groups],
                                 cfg.min_score, cfg.top_fraction)
    for g in (groups[i] for i in below):
        sink.reject("min_score", g.rep, text=g.candidates[0].text,
                    page_url=g.candidates[0].page_url, detail=f"{g.score:.4f} < {cfg.min_score}")
    for g in (groups[i] for i in cut):
        sink.reject("top_fraction", g.rep, text=g.candidates[0].text,
                    page_url=g.candidates[0].page_url,
                    detail=f"{g.score:.4f} below the top {cfg.top_fraction:g}")
    return [groups[i] for i in kept]


def shard_order(g: Group) -> tuple[str, int, int]:
    """Samples go into shards in the order their bytes lie in `images_ok/`: by partition (part
    names start with it), then row, so shards are mixed and the bytes are read sequentially."""
    return (g.rep.src_file, g.rep.row_group, g.rep.row_index)


def pool_table(groups: list[Group], cfg: BuildConfig, book: ListBook | None = None) -> pa.Table:
    """The rows of `pool/` for `groups`, in shard order: each picture's sample as planned (a
    pool row has no key yet: the plan gives it one) and its uid; with URL lists (`book`), the
    extra columns of the list row that named the picture's URL.

    Built a column at a time (a list per column, filled in one loop over the groups), not as a
    dict per row converted back into columns."""
    names = [f.name for f in POOL]
    columns: dict[str, list[Any]] = {name: [] for name in names}
    (uid, image_url, page_url, caption, source, lang, score, width, height, fmt, sha256, phash, src_file,
     row_group, row_index, n_candidates, n_duplicates, _) = (columns[name] for name in names)
    ordered = sorted(groups, key=shard_order)
    for g in ordered:
        best, rep = g.candidates[0], g.rep
        uid.append(sample_uid(rep.url, best.text))
        image_url.append(rep.url)
        page_url.append(best.page_url)
        caption.append(best.text)
        source.append(best.source)
        lang.append(best.lang)
        score.append(best.score)
        width.append(rep.width)
        height.append(rep.height)
        fmt.append(rep.format)
        sha256.append(rep.sha256)
        phash.append(f"{rep.phash:016x}")
        src_file.append(rep.src_file)
        row_group.append(rep.row_group)
        row_index.append(rep.row_index)
        n_candidates.append(len(g.candidates))
        n_duplicates.append(len(g.members) - 1)
    extras = [book.extra_of(g.rep.url) for g in ordered] if book is not None else None
    arrays = {f.name: pa.array(columns[f.name], f.type) for f in POOL if f.name != "meta"}
    arrays["meta"] = plan_metas(ordered, cfg, extras)
    return pa.table({f.name: arrays[f.name] for f in POOL})


def write_pool(work: WorkDir, pool: pa.Table) -> list[pa.Table]:
    """`pool/`: every picture that passed every rule but the score thresholds, with its sample's
    metadata as planned and its uid, partitioned by image URL and in shard order inside each
    partition: what `lait select` chooses from, without rescoring or regrouping. Returns each
    partition's rows as written, in partition order (the order `lait select` reads them in)."""
    partitions = np.array([partition_of(u, work.n_partitions) for u in pool.column("image_url").to_pylist()],
                          np.int64)
    order = np.argsort(partitions, kind="stable")
    bounds = np.flatnonzero(np.diff(partitions[order])) + 1
    written = []
    with PartitionedWriter(work, PLAN_TAG) as parts:
        for idx in np.split(order, bounds) if len(order) else []:
            rows = pool.take(pa.array(idx, pa.int64()))
            parts.write_table("pool", int(partitions[idx[0]]), rows)
            written.append(rows)
    return written


def key_width(samples_per_shard: int) -> int:
    return max(4, len(str(samples_per_shard - 1)))


def pool_rows(work: WorkDir, chosen: pa.Array) -> Iterator[pa.Table]:
    """The rows of `work`'s pool whose uid is in `chosen`, in the pool's order, a row group at
    a time (what `lait select` plans from)."""
    for f in work.part_files("pool"):  # partition order, then part order: images_ok's order
        pf = storage.parquet_file(f)
        for rg in range(pf.num_row_groups):
            t = pf.read_row_group(rg)
            yield t.filter(pc.is_in(t["uid"], value_set=chosen))


def write_plan(plan: WorkDir, rows: Iterable[pa.Table], samples_per_shard: int, tag: str = PLAN_TAG) -> int:
    """`build_plan/` in `plan` (partition N: shard N) from pool rows in the pool's order (shard
    order within each partition), `samples_per_shard` to a shard, each shard committed as soon
    as it is full (one shard's plan in memory at a time). `lait build` (into its own work
    directory) and `lait select` (into its folder's) plan with this; returns the number of shards."""
    width = key_width(samples_per_shard)
    n = 0
    with PartitionedWriter(plan, tag) as parts:
        for t in rows:
            t = t.drop_columns(["uid"])
            start = 0
            while start < t.num_rows:
                s, idx = divmod(n, samples_per_shard)
                take = min(t.num_rows - start, samples_per_shard - idx)
                piece = t.slice(start, take)
                piece = piece.add_column(0, "shard", pa.array([s] * take, pa.int32()))
                piece = piece.add_column(0, "key", pa.array([f"{s:05d}{i:0{width}d}" for i in range(idx, idx + take)],
                                                            pa.string()))
                parts.write_table("build_plan", s, piece)
                n += take
                start += take
                if idx + take == samples_per_shard:
                    parts.commit("build_plan", s)
    return -(-n // samples_per_shard)


def write_plan_by_input(plan: WorkDir, rows: Iterable[pa.Table], samples_per_shard: int, book: ListBook | None
                        ) -> tuple[int, dict[int, int]]:
    """`build_plan/` keyed by input order (`key_order: input`): each sample's shard and key come
    from its list row's position, as img2dataset's (`books.input_key`), so that a key joins
    back to its row. Returns the number of shards (the last one holding a sample) and the
    samples per shard. ConfigError when a sample's URL is no list row's (a crawl's image)."""
    from lait.config import ConfigError

    t = pa.concat_tables(list(rows)).drop_columns(["uid"]) if book is not None else None
    if t is None or t.num_rows == 0:
        return 0, {}
    places = []
    for url in t.column("image_url").to_pylist():
        row = book.by_url.get(url)
        if row is None:
            raise ConfigError(f"build: key_order input needs every sample to come from a URL list; {url} does not "
                              "(a crawled or archived image): build with key_order build")
        places.append(input_key(row.position, samples_per_shard))
    t = t.add_column(0, "shard", pa.array([p[0] for p in places], pa.int32()))
    t = t.add_column(0, "key", pa.array([p[1] for p in places], pa.string()))
    t = t.sort_by([("key", "ascending")])
    shards = t.column("shard").to_numpy()
    per_shard = {int(sh): int(n) for sh, n in zip(*np.unique(shards, return_counts=True))}
    with PartitionedWriter(plan, PLAN_TAG) as parts:
        for sh in per_shard:
            parts.write_table("build_plan", sh, t.filter(pc.equal(t["shard"], sh)))
    return max(per_shard) + 1, per_shard


def write_failures(work: WorkDir, book: ListBook, kept: set[str], build_rejects: dict[str, tuple[str, str | None]],
                   cfg: BuildConfig, per_shard: dict[int, int]) -> list[dict[str, Any]]:
    """`build_failed/`: the list rows that became no sample, each in the shard whose sidecar
    lists it. Keyed by input order, a row goes where its position puts it (img2dataset's
    layout); in build order, the rows are dealt to the shards in turn, their keys following
    the shard's samples. Returns the rows written."""
    rows = failures(work, book, kept, build_rejects)
    n_shards = max(1, len(per_shard))
    width = key_width(cfg.samples_per_shard)
    for j, r in enumerate(rows):
        position = r.pop("position")
        if cfg.key_order == "input":
            r["shard"], r["key"] = input_key(position, cfg.samples_per_shard)
        else:
            shard = j % n_shards
            r["shard"], r["key"] = shard, f"{shard:05d}{per_shard.get(shard, 0) + j // n_shards:0{width}d}"
    with PartitionedWriter(work, PLAN_TAG) as parts:
        for r in rows:
            parts.write("build_failed", r["shard"], r)
    return rows


_META_ENCODER = json.JSONEncoder(ensure_ascii=False, sort_keys=True)  # once, not per row as `json.dumps` would
# The same text without sorting: for metadata built with its keys in sorted order already.
_SORTED_META_ENCODER = json.JSONEncoder(ensure_ascii=False, check_circular=False)


def image_license(figure: str | None, file: str | None) -> dict[str, str | None]:
    """The licence declared for the picture itself, apart from its page's (`license`): the one
    its page gives it (`figure`: a rel="license" link in its figure), else the one its file
    carries (`file`: XMP, IPTC), with where it came from (`figure`, `file`; None when neither).
    The pairs and the documents (`lait.build.documents`) both ship it."""
    if figure:
        return {"image_license": figure, "image_license_from": "figure"}
    if file:
        return {"image_license": file, "image_license_from": "file"}
    return {"image_license": None, "image_license_from": None}


def plan_metas(groups: list[Group], cfg: BuildConfig, extras: list[dict[str, Any] | None] | None = None
               ) -> pa.Array:
    """`plan_meta("", g, cfg, extra)` of every group, the same text, made a column at a time
    (`lait.jsontext`); a group with a list's extra columns goes through `plan_meta` itself."""
    from lait import jsontext as jt

    n = len(groups)
    cand: dict[str, list[Any]] = {k: [] for k in ("lang", "page_url", "score", "source", "text")}
    n_cands, faces, urls, n_urls = [], [], [], []
    row: dict[str, list[Any]] = {k: [] for k in ("caption", "fetched_sha256", "height", "image_license",
                                                 "image_license_from", "lang",
                                                 "license", "model", "n_candidates", "n_duplicates",
                                                 "original_format", "page_url", "pages", "phash", "pretrained",
                                                 "punsafe", "score", "sha256", "source", "url", "width")}
    (caption, fetched, height, lic, lic_from, lang, license_, model, n_candidates, n_duplicates, fmt, page_url, pages, phash,
     pretrained, punsafe, score, sha256, source, url, width) = row.values()
    for g in groups:
        best, rep = g.candidates[0], g.rep
        shown = g.candidates[:cfg.max_candidates]
        n_cands.append(len(shown))
        for c in shown:
            cand["lang"].append(c.lang)
            cand["page_url"].append(c.page_url)
            cand["score"].append(round(float(c.score), 6))
            cand["source"].append(c.source)
            cand["text"].append(c.text)
        caption.append(best.text)
        fetched.append(rep.fetched_digest)
        faces.append(_FACES_ENCODER.encode([[round(float(v), 4) for v in b] for b in rep.face_bboxes])
                     if rep.face_bboxes else "[]")
        height.append(rep.height)
        il = image_license(best.image_license, rep.rights)
        lic.append(il["image_license"])
        lic_from.append(il["image_license_from"])
        lang.append(best.lang)
        license_.append(best.license)
        model.append(best.model)
        n_candidates.append(len(g.candidates))
        n_duplicates.append(len(g.members) - 1)
        fmt.append(rep.format)
        page_url.append(best.page_url)
        pages.append(g.pages)
        phash.append(f"{rep.phash:016x}")
        pretrained.append(best.pretrained)
        punsafe.append(punsafe_value(rep.punsafe))
        score.append(round(float(best.score), 6))
        sha256.append(rep.sha256)
        source.append(best.source)
        url.append(rep.url)
        width.append(rep.width)
        member_urls = [im.url for im in g.members[:17]]
        urls += member_urls
        n_urls.append(len(member_urls))

    def text(values: list[Any]) -> pa.Array:
        return jt.strings(pa.array(values, pa.string()))

    def ints(values: list[Any]) -> pa.Array:
        return jt.ints(pa.array(values, pa.int64()))

    cands = jt.concat('{"lang": ', text(cand["lang"]), ', "page_url": ', text(cand["page_url"]), ', "score": ',
                      jt.floats(cand["score"]), ', "source": ', text(cand["source"]), ', "text": ', text(cand["text"]),
                      "}")
    out = jt.concat(
        '{"candidates": ', jt.lists(cands, np.array(n_cands, np.int64)), ', "caption": ', text(caption),
        ', "face_bboxes": ', pa.array(faces, pa.string()), ', "fetched_sha256": ', text(fetched), ', "height": ', ints(height), ', "image_license": ',
        text(lic), ', "image_license_from": ', text(lic_from), ', "key": "", "lang": ', text(lang), ', "license": ',
        text(license_), ', "model": ', text(model), ', "n_candidates": ', ints(n_candidates), ', "n_duplicates": ',
        ints(n_duplicates), ', "original_format": ', text(fmt), ', "page_url": ', text(page_url), ', "pages": ',
        ints(pages), ', "phash": ', text(phash), ', "pretrained": ', text(pretrained), ', "punsafe": ',
        jt.floats(punsafe), ', "score": ', jt.floats(score), ', "sha256": ', text(sha256), ', "source": ',
        text(source), ', "status": "success", "url": ', text(url), ', "urls": ',
        jt.lists(text(urls), np.array(n_urls, np.int64)), ', "width": ', ints(width), "}")
    if extras is not None and any(extras):
        listed = [i for i in range(n) if extras[i]]
        mask = np.zeros(n, bool)
        mask[listed] = True
        out = pc.replace_with_mask(out, pa.array(mask), pa.array([plan_meta("", groups[i], cfg, extras[i])
                                                                  for i in listed], pa.string()))
    return out


_FACES_ENCODER = json.JSONEncoder()  # face boxes: lists of floats, the same text as `_META_ENCODER` gives


def plan_meta(key: str, g: Group, cfg: BuildConfig, extra: dict[str, Any] | None = None) -> str:
    """A plan row's `meta`: KEY.json as the global pass decides it (`build.sample.make_sample`
    completes it), a JSON object with sorted keys.

    The dicts are built with their keys in sorted order and encoded without sorting, which is
    the same text as `sort_keys` gives; a list's extra columns (any keys, any nesting) go
    through the sorting encoder."""
    best, rep = g.candidates[0], g.rep
    lic = image_license(best.image_license, rep.rights)
    meta = {
        "candidates": [{"lang": c.lang, "page_url": c.page_url, "score": round(float(c.score), 6),
                        "source": c.source, "text": c.text} for c in g.candidates[:cfg.max_candidates]],
        "caption": best.text,
        "face_bboxes": [[round(float(v), 4) for v in b] for b in rep.face_bboxes or ()],
        "fetched_sha256": rep.fetched_digest,
        "height": rep.height,
        "image_license": lic["image_license"],
        "image_license_from": lic["image_license_from"],
        "key": key,
        "lang": best.lang,
        "license": best.license,
        "model": best.model,
        "n_candidates": len(g.candidates),
        "n_duplicates": len(g.members) - 1,
        "original_format": rep.format,
        "page_url": best.page_url,
        "pages": g.pages,
        "phash": f"{rep.phash:016x}",
        "pretrained": best.pretrained,
        "punsafe": punsafe_value(rep.punsafe),
        "score": round(float(best.score), 6),
        "sha256": rep.sha256,
        "source": best.source,
        "status": "success",
        "url": rep.url,
        "urls": [im.url for im in g.members[:17]],
        "width": rep.width,
    }
    if extra:
        meta["extra"] = extra  # the list's columns, after the fixed ones (`build.sample.make_sample`)
        return _META_ENCODER.encode(meta)
    return _SORTED_META_ENCODER.encode(meta)
