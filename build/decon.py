"""Decontamination: the images of an evaluation set kept out of the training data.

`--exclude-eval DIR|KARPATHY.json` names an evaluation set (a folder of images, walked
recursively, or a Karpathy-style JSON, all splits or those of `--exclude-eval-split`). Every
image of the training pool that shows one of its pictures, resized, re-encoded or cropped by a
few per cent, is dropped as `build/eval_overlap`, so that a retrieval score after pretraining on
web data is not a score on photos the model was trained on.

Matching, in two steps:

1. Perceptual hashes, with stage 2's very function (`lait.imagehash`): each evaluation image is
   hashed whole and as nine 3 % crops (the crop taken from each corner, edge and the centre),
   and a pool image is a candidate when its `images_ok.phash` is within `eval_max_phash` bits
   of any of those ten hashes. The nine crops are what makes a small radius enough: a pool copy
   cropped by 3 % on one side is up to 20 bits from the whole image's hash, as far as distinct
   photos come, but within 8 bits of the nearest crop's.
2. Pixels, as the build's own duplicate check (`lait.build.pixels.pixel_diff`): a candidate is
   an overlap when some alignment of the two pictures (one of them cropped by 0 to 4.5 % on each
   axis, at either end or centred, against the other whole) leaves no 16x16 thumbnail cell more
   than `eval_max_diff` apart.

Measured on all 3,000 Flickr8k photos and 80 COCO photos in ../shared/data: copies resized to
160 and 400 px, re-encoded at JPEG quality 40 and 60, and cropped by 2 or 3 % (one corner, the
opposite corner, centred, a random offset) lie from their original's nearest hash at: train split
(14,856 copies) min 0, p50 0, p99 4, p99.9 6, max 8 -- hence `eval_max_phash` 8 -- and at most 6
on val, 8 on test and COCO. Distinct photos, each one's ten hashes against every other's whole
(9.5 million ordered pairs): min 8, p1 20, p50 28, p99 38, max 50; 3 pairs within 8 bits, 47
within 10. Without the crops' hashes a one-sided 3 % crop lies up to 20 bits away, and 5,218
distinct pairs within 18. Aligned pixel differences of the copies: train p50 16.6, p99 30.5,
max 39.5 (val, test, COCO at most 39.0); of distinct photos within 12 bits at least 54.2 -- hence
`eval_max_diff` 46 -- but for one pair: Flickr8k test photo 3323988406 and train photo 3540241710
are two frames of one skatepark scene, seconds apart (8 bits, 40.3), which the check takes for
the same picture (a leak of the scene, if not a copy). `tests/build/test_decon.py` plants copies
of 40 test photos among 280 other photos and checks that exactly the copies go.

Cost: the pool's hashes are searched in a multi-index hash of the evaluation hashes
(`HashIndex`): O(N_pool * (probes + candidates)) instead of N_pool * N_eval * 10 comparisons.
Measured on one core: 0.6 us a pool image against 40 evaluation images, 16 us against 40,000
and 25 us against 100,000 (a million hashes): ten million pool images in about four minutes.
Only the candidates' pixels are decoded (about 2 ms a pair), a block of pool images at a time:
with 2 to 3 distinct pairs in 10 million within 8 bits, a set of 100,000 images makes some 3 %
of a pool candidates of the pixel check. The evaluation set is hashed once (about 2 ms an
image), its hashes kept under a digest of its files' names, sizes and modification times.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from lait.build.pixels import pixel_diffs
from lait.config import ConfigError
from lait.imagehash import exif_orientation, phash_of, reduced_preview, to_rgb, upright
from lait.storage import cache_root

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
CROP = 0.03
# The regions of an evaluation image that are hashed: the whole, then a 3 % crop from each
# corner, edge and the centre (fractions of width and height: x0, y0, x1, y1).
VIEW_BOXES = [(0.0, 0.0, 1.0, 1.0)] + [(ox * CROP, oy * CROP, 1 - (1 - ox) * CROP, 1 - (1 - oy) * CROP)
                                       for ox in (0.0, 0.5, 1.0) for oy in (0.0, 0.5, 1.0)]
DETAIL = 64  # side of the colour images the pixel check crops its alignments from
SIDE = 16  # side of the thumbnails it compares (as `lait.build.pixels`)
# The alignments the pixel check tries: each axis cropped by 0, 1.5, 3 or 4.5 % at either end
# or centred, the two axes independently (100 boxes, the whole picture first).
_SPANS = sorted({(round(off, 4), round(1 - (c - off), 4)) for c in (0.0, 0.015, 0.03, 0.045)
                 for off in (0.0, c / 2, c)}, key=lambda span: (span != (0.0, 1.0), span))
ALIGN_BOXES = [(x0, y0, x1, y1) for x0, x1 in _SPANS for y0, y1 in _SPANS]


# -- the evaluation set ------------------------------------------------------------------------
@dataclass
class EvalSet:
    """The images of an evaluation set: names as the set gives them, files, and the phash of each
    image's `VIEW_BOXES` (n x 10 uint64)."""

    source: str
    names: list[str]
    paths: list[Path]
    hashes: np.ndarray

    def __len__(self) -> int:
        return len(self.names)

    @property
    def digest(self) -> str:
        """What the build's fingerprint holds for the set: a digest of its images' hashes,
        whatever their names, order or folder (a changed, added or removed image changes it)."""
        rows = sorted(map(tuple, self.hashes.tolist()))
        return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:32]

    def detail(self, i: int) -> np.ndarray | None:
        return detail_of(read_image(self.paths[i]))


def eval_files(spec: str, splits: Sequence[str] = (), root: str = "") -> list[tuple[str, Path]]:
    """(name, file) of every image of the set `spec` names, sorted by name; a ConfigError when
    it is missing, empty, or names images that are not there."""
    p = Path(spec).expanduser()
    if p.is_dir():
        if splits:
            raise ConfigError(f"--exclude-eval-split applies to a Karpathy JSON; {spec} is a folder")
        files = sorted((f.relative_to(p).as_posix(), f) for f in p.rglob("*")
                       if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file())
        if not files:
            raise ConfigError(f"--exclude-eval {spec}: no images (*.jpg, *.jpeg, *.png, *.webp) in the folder")
        return files
    if p.is_file():
        return karpathy_files(p, splits, Path(root).expanduser() if root else None)
    raise ConfigError(f"--exclude-eval {spec}: no such folder or file")


def karpathy_files(path: Path, splits: Sequence[str], root: Path | None = None) -> list[tuple[str, Path]]:
    """The images of a Karpathy-style JSON (`images: [{filename, filepath?, split, ...}]`), relative
    to `root`, of `splits` (all when empty). Without a root, the images are looked for beside the
    JSON, then in each folder beside it: the usual layouts put them there (Flickr8k's `images/`,
    `Images/` or `Flicker8k_Dataset/`, Flickr30k's `flickr30k-images/`, COCO's `train2014/` and
    `val2014/` named by each entry's `filepath`)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        items = data["images"]
        entries = [(str(it.get("split", "")), Path(it.get("filepath") or "") / it["filename"]) for it in items]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"--exclude-eval {path}: not a Karpathy-style JSON "
                          f"(images: [{{filename, filepath?, split}}]): {type(exc).__name__}: {exc}") from None
    present = sorted({s for s, _ in entries})
    unknown = sorted(set(splits) - set(present))
    if unknown:
        raise ConfigError(f"--exclude-eval-split {', '.join(unknown)}: {path} has the splits {', '.join(present)}")
    chosen = sorted({rel.as_posix() for s, rel in entries if not splits or s in splits})
    if not chosen:
        raise ConfigError(f"--exclude-eval {path}: lists no images")
    if root is not None:
        roots = [root]
    else:
        beside = sorted((d for d in path.parent.iterdir() if d.is_dir() and not d.name.startswith(".")),
                        key=lambda d: d.name)
        roots = [path.parent] + [d for d in beside if (d / chosen[0]).is_file()]
    closest: tuple[Path, list[str]] | None = None
    for folder in roots:
        files = [(name, folder / name) for name in chosen]
        missing = [name for name, f in files if not f.is_file()]
        if not missing:
            return files
        if closest is None or len(missing) < len(closest[1]):
            closest = (folder, missing)
    assert closest is not None
    folder, missing = closest
    where = f"in {folder}" if root is not None else f"beside it or in a folder beside it (fewest missing: {folder})"
    raise ConfigError(f"--exclude-eval {path}: {len(missing)} of its {len(chosen)} images are not {where} "
                      f"({missing[0]}, ...); --exclude-eval-root names the folder they are in")


def read_image(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"--exclude-eval: cannot read {path}: {exc}") from None


def view_hashes(data: bytes, name: str) -> list[int]:
    """The phash of each of `VIEW_BOXES` of an image, decoded as stage 2 decodes (`lait.imagehash`).

    An image that does not decode is a ConfigError: the set is the user's own curated input,
    and skipping one of its images would leave its copies in the training data unnoticed,
    with no row of the dataset to record a reason on."""
    try:
        img = Image.open(io.BytesIO(data))
        small = reduced_preview(img, exif_orientation(img)).image
    except Exception as exc:  # noqa: BLE001 - any decoder failure: name the file
        raise ConfigError(f"--exclude-eval: {name} is not a readable image ({type(exc).__name__}: {exc}); "
                          f"remove it from the evaluation set or replace it") from None
    w, h = small.size
    return [phash_of(small.crop((round(x0 * w), round(y0 * h), max(round(x1 * w), 1), max(round(y1 * h), 1))))
            for x0, y0, x1, y1 in VIEW_BOXES]


_MEMO: dict[str, EvalSet] = {}
HASH_VERSION = 1  # of `view_hashes`: bump when it changes, so that no cached hash outlives it


def _cache_dir() -> Path:
    return cache_root() / "eval-hashes"


def _content_digest(hashes: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(hashes).tobytes()).hexdigest()[:16]


def _read_cached(key: str, n: int) -> np.ndarray | None:
    """The cached hashes of `key`, or None when missing or damaged: the file's name ends in the
    digest of its hashes, so a flipped byte makes it be hashed again instead of trusted."""
    for path in _cache_dir().glob(f"{key}-*.npy"):
        try:
            hashes = np.load(path, allow_pickle=False)
        except (OSError, ValueError):
            continue
        if (hashes.dtype == np.uint64 and hashes.shape == (n, len(VIEW_BOXES))
                and path.stem.endswith(_content_digest(hashes))):
            return hashes
    return None


def _write_cached(key: str, hashes: np.ndarray) -> None:
    path = _cache_dir() / f"{key}-{_content_digest(hashes)}.npy"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.save(f, hashes, allow_pickle=False)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only home: the next process hashes again, nothing worse
        log.warning("exclude-eval: cannot keep the hashes in %s: %s", path.parent, exc)


def load_eval_set(spec: str, splits: Sequence[str] = (), root: str = "") -> EvalSet:
    """The evaluation set `spec` names, hashed. The hashes are kept per process (the build's
    fingerprint, its plan and `lait status` all ask) and in `$LAIT_CACHE/eval-hashes/` (default
    ~/.cache/lait), under a digest of every file's path, size and modification time: a set of
    100,000 photos takes minutes to hash, and a rerun of `lait build` should not."""
    files = eval_files(spec, splits, root)
    listing = []
    for _, f in files:
        st = os.stat(f)
        listing.append((str(f.resolve()), st.st_size, st.st_mtime_ns))
    key = hashlib.sha256(json.dumps([HASH_VERSION, [n for n, _ in files], listing]).encode()).hexdigest()[:32]
    if key not in _MEMO:
        hashes = _read_cached(key, len(files))
        if hashes is None:
            hashes = np.array([view_hashes(read_image(f), name) for name, f in files], np.uint64)
            hashes = hashes.reshape(-1, len(VIEW_BOXES))
            _write_cached(key, hashes)
            log.info("exclude-eval: %d images of %s hashed", len(files), spec)
        _MEMO.clear()  # one set at a time: a process builds with one
        _MEMO[key] = EvalSet(spec, [n for n, _ in files], [f for _, f in files], hashes)
    return _MEMO[key]


# -- the search --------------------------------------------------------------------------------
PROBE_NS, CANDIDATE_NS = 5.0, 20.0  # measured cost of one bucket probe and one candidate, per query


def _flip_masks(bits: int, flips: int) -> np.ndarray:
    """Every `bits`-bit mask with at most `flips` bits set."""
    masks = [sum(1 << i for i in c) for k in range(flips + 1) for c in itertools.combinations(range(bits), k)]
    return np.array(masks, np.uint64)


def _layout(n: int, radius: int) -> tuple[int, int, int]:
    """(bits per substring, substrings, flips) that make a search of `n` entries cheapest: more
    bits mean fewer entries per bucket but more buckets to probe (`PROBE_NS`, `CANDIDATE_NS`)."""
    best = None
    for bits in range(8, 22):  # a dense table of 2^21 buckets is 8 MB a substring
        m = 64 // bits
        flips = radius // m
        probes = m * sum(math.comb(bits, k) for k in range(flips + 1))
        cost = probes * (PROBE_NS + CANDIDATE_NS * n / 2 ** bits)
        if best is None or cost < best[0]:
            best = (cost, bits, m, flips)
    return best[1], best[2], best[3]


class HashIndex:
    """Every entry within `radius` bits of a query, by multi-index hashing (Norouzi et al.,
    2012): the 64 bits are cut into m substrings of b bits; two hashes within r bits agree within
    r // m bits on at least one substring (pigeonhole), so a query probes, per substring, the
    buckets of its value with up to r // m bits flipped, and only the entries found there are
    compared whole. Each substring's buckets are a dense table (a bucket's start and size in the
    entries sorted by that substring), probed for a block of queries at once with numpy.

    Cost per query: m * sum_{k <= r//m} C(b, k) probes plus the entries they hold, about
    probes * N / 2^b; b is chosen per N (`_layout`): for r = 8 and a million entries (100,000
    evaluation images, ten hashes each) b = 21, 696 probes and about 330 candidates, some 10 us
    a query -- a pool of ten million images in a few minutes, where comparing every pair would
    take 10^13 popcounts. Exact: the tests compare it with brute force."""

    def __init__(self, hashes: np.ndarray, radius: int):
        self.hashes = np.asarray(hashes, np.uint64).reshape(-1)
        self.radius = radius
        self.bits, self.m, flips = _layout(len(self.hashes), radius)
        self.masks = _flip_masks(self.bits, flips)
        self.tables = []
        full = np.uint64((1 << self.bits) - 1)
        for j in range(self.m):
            keys = ((self.hashes >> np.uint64(j * self.bits)) & full).astype(np.int64)
            order = np.argsort(keys, kind="stable")
            counts = np.bincount(keys, minlength=1 << self.bits).astype(np.int64)
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
            self.tables.append((order, counts, starts))

    def search(self, queries: np.ndarray, chunk: int = 1 << 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(query index, entry index, distance) of every pair within the radius, each once."""
        queries = np.asarray(queries, np.uint64).reshape(-1)
        found_q, found_e = [], []
        full = np.uint64((1 << self.bits) - 1)
        for start in range(0, len(queries), chunk):
            block = queries[start:start + chunk]
            for j, (order, counts, starts) in enumerate(self.tables):
                sub = (block >> np.uint64(j * self.bits)) & full
                for mask in self.masks:
                    keys = (sub ^ mask).astype(np.int64)
                    sizes = counts[keys]
                    hit = np.flatnonzero(sizes)
                    if not hit.size:
                        continue
                    n = sizes[hit]
                    q = np.repeat(hit, n)
                    within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
                    e = order[np.repeat(starts[keys[hit]], n) + within]
                    near = np.bitwise_count(block[q] ^ self.hashes[e]) <= self.radius
                    found_q.append(q[near] + start)
                    found_e.append(e[near])
        if not found_q:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        pair = np.unique(np.concatenate(found_q) * len(self.hashes) + np.concatenate(found_e))
        q, e = pair // len(self.hashes), pair % len(self.hashes)
        return q, e, np.bitwise_count(queries[q] ^ self.hashes[e]).astype(np.int64)


# -- the pixel check ---------------------------------------------------------------------------
def detail_of(data: bytes) -> np.ndarray | None:
    """`DETAIL` x `DETAIL` RGB of an image (upright, box-filtered), or None when it does not decode."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            orientation = exif_orientation(im)
            im.draft("RGB", (DETAIL * 2, DETAIL * 2))  # JPEG: decode at a reduced scale, enough for 64 px
            rgb = upright(to_rgb(im), orientation)
            return np.asarray(rgb.resize((DETAIL, DETAIL), Image.Resampling.BOX), np.uint8)
    except Exception:  # noqa: BLE001 - an undecodable image confirms nothing
        return None


def views(detail: np.ndarray) -> np.ndarray:
    """The `ALIGN_BOXES` crops of a detail image, each box-shrunk to `SIDE` x `SIDE` (the first: the whole)."""
    im = Image.fromarray(detail)
    w, h = im.size
    return np.stack([np.asarray(im.resize((SIDE, SIDE), Image.Resampling.BOX, box=(x0 * w, y0 * h, x1 * w, y1 * h)),
                                np.uint8) for x0, y0, x1, y1 in ALIGN_BOXES])


def aligned_diff(a: np.ndarray, b: np.ndarray) -> float:
    """The smallest `pixel_diff` over the alignments: a crop of either view stack against the
    other's whole picture (`views` output, whole first)."""
    return float(min(pixel_diffs(a, b[0]).min(), pixel_diffs(a[0], b).min()))


@dataclass(frozen=True)
class Overlap:
    """Why a pool image is an evaluation image: which one, how many bits from its nearest view's
    hash, and the pixel difference of the best alignment."""

    eval_name: str
    bits: int
    diff: float

    def detail(self) -> str:
        return f"evaluation image {self.eval_name}: phash within {self.bits} bits, pixels within {self.diff:.1f}"


# Candidates are checked a block of pool images at a time, and the alignments of at most this
# many evaluation images are kept: 77 KB each, where a whole set's would not fit in memory.
POOL_BLOCK = 2048
EVAL_VIEWS_KEPT = 2048


def find_overlaps(eval_set: EvalSet, phashes: np.ndarray, pool_details: Callable[[list[int]], dict[int, np.ndarray]],
                  max_phash: int, max_diff: float) -> dict[int, Overlap]:
    """The pool images (by index into `phashes`) that show a picture of `eval_set`.
    `pool_details(indices)` gives the detail images (`detail_of`) of those it can decode; one
    that does not decode is no overlap (it cannot reach a shard either: `build/unreadable`)."""
    n_views = eval_set.hashes.shape[1]
    q, entry, dist = HashIndex(eval_set.hashes.reshape(-1), max_phash).search(phashes)
    # Each pool image's candidates: evaluation images by their nearest view, nearest first.
    candidates: dict[int, list[tuple[int, int]]] = {}
    e = entry // n_views
    for qi, ei, di in zip(*(a.tolist() for a in (q, e, dist))):
        candidates.setdefault(qi, []).append((di, ei))
    eval_views: dict[int, np.ndarray | None] = {}
    found: dict[int, Overlap] = {}
    refused = 0
    pool = sorted(candidates)
    for start in range(0, len(pool), POOL_BLOCK):
        block = pool[start:start + POOL_BLOCK]
        details = pool_details(block)
        for qi in block:
            if qi not in details:
                continue
            mine = views(details[qi])
            best: dict[int, int] = {}
            for di, ei in sorted(candidates[qi]):
                best.setdefault(ei, di)
            for ei, di in sorted(best.items(), key=lambda kv: (kv[1], kv[0])):
                if ei not in eval_views:
                    if len(eval_views) >= EVAL_VIEWS_KEPT:
                        eval_views.clear()
                    d = eval_set.detail(ei)
                    eval_views[ei] = views(d) if d is not None else None
                theirs = eval_views[ei]
                diff = aligned_diff(mine, theirs) if theirs is not None else math.inf
                if diff <= max_diff:
                    found[qi] = Overlap(eval_set.names[ei], di, diff)
                    break
                refused += 1
    log.info("exclude-eval: %d pool images within %d bits of %s, %d confirmed by their pixels, %d pairs refused",
             len(pool), max_phash, eval_set.source, len(found), refused)
    return found
