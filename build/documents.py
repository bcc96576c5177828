"""Stage 5's documents (`lait documents`, issue 63): doc_pages/ + doc_sims/ + images_ok/ ->
WORK/documents/ (MMC4 JSON in WebDataset tars, OBELICS-style Parquet).

Each document of stage 3's document pass (`lait.filters.documents`) goes through these rules,
in this order, each drop written to `rejected/` with its `documents/` reason:

1. `too_few_words`: fewer than `min_words` words of main text;
2. `repeated_paragraphs`: more than `max_repeated_share` of its paragraphs repeat another one;
3. `near_duplicate`: its word 5-grams overlap those of a document kept before it (page URL
   order) by `max_overlap` or more, estimated with MinHash (64 hashes, 16 bands of 4);
4. pictures: those stage 2 kept (an images_ok/ row; so no unsafe, opted-out or too small
   picture is ever here) with stage 4's similarity to every sentence (`doc_sims/`); a picture
   whose best sentence scores under `min_sim` leaves. The others are placed among the
   sentences by a one-to-one assignment that maximises the summed similarity (MMC4's bipartite
   matching; `assign`): no sentence holds two pictures, and a picture left over when there are
   more pictures than sentences leaves too. `no_image` when none is left; `too_many_images`
   when more than one picture per `min_words_per_image` words remains.

What is written for a kept document:

- `NNNNN.tar`: one sample per document, `KEY.json`, in MMC4's shape (`url`, `text_list`,
  `image_info` with `image_name`, `raw_url`, `matched_text_index`, `matched_sim`,
  `face_detections`, and the picture itself as `image_base64`, as OpenFlamingo's MMC4 loader
  reads it; `similarity_matrix`, images x sentences) plus lait's `uid`, `license`, `lang`,
  `title` and each picture's `uid`, `sha256`, `width`, `height` and its own licence as the pair
  shards give it (`image_license`: its figure's rel="license" link, else its file's XMP or IPTC
  rights; `image_license_from`: `figure`, `file` or null);
- `NNNNN.parquet`: the same documents as OBELICS lays them out, in DOM order: `texts` and
  `images` aligned lists with None in the other's slots (a paragraph per text slot; the image
  slot holds the picture's URL, `image_bytes` its bytes as written), `metadata` (JSON per slot;
  a picture's: its `uid`, `sha256`, sizes, faces and licence) and `general_metadata`
  (JSON of the document);
- `stats.json`: the counts, the rules' drops, a few examples, and each file's size and SHA-256
  (`files`), which `lait verify` reads the files back against.

Every picture written is the one stage 5 writes into the pair shards: resized and encoded by
`lait.build.resize.prepare`, faces searched at the size it ships and blurred
(`lait.build.shards.FaceSearch`, whose `faces/` cache the pair build shares). A document's
`uid` is the MD5 of its page URL; a picture's that of its URL, a tab and the page URL. The
folder is written next to itself and swapped in when complete, so a failed run leaves the last
complete one.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import re
import shutil
import tarfile
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lait import storage
from lait.build.aggregate import image_license
from lait.build.config import DocumentsConfig
from lait.build.resize import prepare
from lait.build.shards import FaceSearch
from lait.parts import PartitionedWriter
from lait.workdir import WorkDir, partition_of

log = logging.getLogger(__name__)

TAG = "documents_build"  # the tag of the rejected/ parts this pass writes (replaced on each run)
FOLDER = "documents"  # WORK/documents/, unless `out` says otherwise
SHINGLE = 5
N_HASHES, BANDS = 64, 16
_WORD = re.compile(r"\w+", re.U)
_SEEDS = np.random.default_rng(20231105).integers(1, 2**63 - 1, size=(2, N_HASHES), dtype=np.int64).astype(np.uint64)

OBELICS = pa.schema([
    pa.field("images", pa.list_(pa.string())),
    pa.field("image_bytes", pa.list_(pa.binary())),
    pa.field("texts", pa.list_(pa.string())),
    pa.field("metadata", pa.string()),
    pa.field("general_metadata", pa.string()),
    pa.field("uid", pa.string()),
    pa.field("url", pa.string()),
    pa.field("license", pa.string()),
])


# -- the assignment ----------------------------------------------------------------------------

def _min_cost_rows(cost: np.ndarray) -> list[int]:
    """For a (n x m) cost matrix with n <= m, the column each row takes in a one-to-one choice of
    least total cost (the Hungarian method with potentials, O(n^2 m))."""
    n, m = cost.shape
    inf = float("inf")
    u = np.zeros(n + 1)
    v = np.zeros(m + 1)
    p = np.zeros(m + 1, dtype=np.int64)  # p[j]: the row (1-based) holding column j; 0: none
    way = np.zeros(m + 1, dtype=np.int64)
    for i in range(1, n + 1):
        p[0] = i
        j0 = 0
        minv = np.full(m + 1, inf)
        used = np.zeros(m + 1, dtype=bool)
        while True:
            used[j0] = True
            i0 = p[j0]
            free = ~used[1:]
            cur = cost[i0 - 1] - u[i0] - v[1:]
            better = free & (cur < minv[1:])
            minv[1:][better] = cur[better]
            way[1:][better] = j0
            cand = np.where(free, minv[1:], inf)
            j1 = int(np.argmin(cand)) + 1
            delta = cand[j1 - 1]
            u[p[used]] += delta
            v[used] -= delta
            minv[1:][free] -= delta
            j0 = j1
            if p[j0] == 0:
                break
        while j0:
            j1 = way[j0]
            p[j0] = p[j1]
            j0 = j1
    rows = [-1] * n
    for j in range(1, m + 1):
        if p[j]:
            rows[p[j] - 1] = j - 1
    return rows


def assign(sims: np.ndarray) -> dict[int, int]:
    """image row -> sentence column of the one-to-one assignment with the largest summed
    similarity; with more images than sentences, the images left over get none."""
    sims = np.asarray(sims, np.float64)
    if sims.size == 0:
        return {}
    if sims.shape[0] <= sims.shape[1]:
        return dict(enumerate(_min_cost_rows(-sims)))
    cols = _min_cost_rows(-sims.T)
    return {i: j for j, i in enumerate(cols)}


# -- the near-duplicate index ------------------------------------------------------------------

def minhash(words: list[str]) -> np.ndarray:
    """64 MinHash values of the document's word 5-grams (of its words when shorter)."""
    grams = {" ".join(words[i:i + SHINGLE]) for i in range(max(1, len(words) - SHINGLE + 1))}
    h = np.array([int.from_bytes(hashlib.blake2b(g.encode(), digest_size=8).digest(), "big") for g in grams],
                 dtype=np.uint64)
    return (np.outer(h, _SEEDS[0]) + _SEEDS[1]).min(axis=0)  # wraps mod 2**64: a family of hashes


class NearDuplicates:
    """Documents kept so far, banded by their MinHash; `seen` answers whether a new one overlaps
    one of them by `threshold` (estimated Jaccard) and keeps it when not."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.buckets: dict[tuple[int, bytes], list[int]] = defaultdict(list)
        self.sigs: list[np.ndarray] = []
        self.urls: list[str] = []

    def seen(self, url: str, sig: np.ndarray) -> tuple[str, float] | None:
        rows = N_HASHES // BANDS
        keys = [(b, sig[b * rows:(b + 1) * rows].tobytes()) for b in range(BANDS)]
        if self.threshold < 1.0:
            for k in sorted({i for key in keys for i in self.buckets.get(key, ())}):
                share = float(np.mean(self.sigs[k] == sig))
                if share >= self.threshold:
                    return self.urls[k], share
        for key in keys:
            self.buckets[key].append(len(self.sigs))
        self.sigs.append(sig)
        self.urls.append(url)
        return None


# -- the pass ----------------------------------------------------------------------------------

def words_of(paragraphs: list[list[str]]) -> list[str]:
    return _WORD.findall(" ".join(s for p in paragraphs for s in p).lower())


def repeated_share(paragraphs: list[list[str]]) -> float:
    """The share of paragraphs whose text (case and spacing aside) another paragraph has too."""
    keys = [" ".join(" ".join(p).lower().split()) for p in paragraphs]
    counts = Counter(keys)
    return sum(1 for k in keys if counts[k] > 1) / max(1, len(keys))


def uid_of(*parts: str) -> str:
    return hashlib.md5("\t".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


class _Counts:
    """What `FaceSearch` counts into, as a stage task's context would."""

    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] += n


def out_dir(cfg: DocumentsConfig) -> storage.Location:
    return storage.location(cfg.out) if cfg.out else storage.location(cfg.work) / FOLDER


def write_documents(cfg: DocumentsConfig) -> dict[str, Any]:
    """Write WORK/documents/ (or `cfg.out`) from the work directory's document tables; returns
    the stats written beside the files."""
    work = WorkDir(cfg.work)
    started = time.perf_counter()
    out = out_dir(cfg)
    remote = isinstance(out, storage.RemotePath)
    # On object storage the files are made in a local folder and go up when complete (`_publish`).
    staging = Path(tempfile.mkdtemp(prefix="lait-documents-")) if remote else out.with_name(out.name + ".staging")
    if not remote:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    opts = cfg.image_options()
    counts = _Counts()
    c = counts.counters
    dups = NearDuplicates(cfg.max_overlap)
    image_docs: Counter[str] = Counter()
    shard, in_shard = 0, 0
    tar: tarfile.TarFile | None = None
    rows: list[dict[str, Any]] = []
    shown: list[dict[str, Any]] = []
    work.remove_parts("rejected", TAG)

    def close_shard() -> None:
        nonlocal tar, rows, shard, in_shard
        if tar is not None:
            tar.close()
            pq.write_table(pa.Table.from_pylist(rows, schema=OBELICS), staging / f"{shard:05d}.parquet")
            tar, rows, in_shard = None, [], 0
            shard += 1

    with PartitionedWriter(work, TAG) as parts:
        for part in work.partitions("doc_pages"):
            docs = sorted(work.read("doc_pages", part).to_pylist(), key=lambda d: d["page_url"])
            sims = {r["page_url"]: r for r in (work.read("doc_sims", part).to_pylist()
                                               if part in work.partitions("doc_sims") else [])}
            kept_rows = _images_ok(work, {u for r in sims.values() for u in r["image_urls"] if u})
            faces = FaceSearch(work, opts, [r["sha256"] for r in kept_rows.values()])
            for doc in docs:
                url = doc["page_url"]
                c["documents/in"] += 1
                verdict, made = _document(doc, sims.get(url), kept_rows, cfg, dups, opts, faces, counts)
                if verdict is not None:
                    rule, detail = verdict
                    parts.reject(f"documents/{rule}", part, page_url=url, detail=detail)
                    c[f"documents/{rule}"] += 1
                    continue
                mmc4, obelics = made
                for info in mmc4["image_info"]:
                    image_docs[info["raw_url"]] += 1
                if tar is None:
                    tar = tarfile.open(staging / f"{shard:05d}.tar", "w", format=tarfile.USTAR_FORMAT)
                key = f"{shard:05d}{in_shard:04d}"
                data = json.dumps(mmc4, ensure_ascii=False).encode()
                member = tarfile.TarInfo(f"{key}.json")
                member.size, member.mtime = len(data), 0
                tar.addfile(member, io.BytesIO(data))
                rows.append(obelics)
                in_shard += 1
                c["documents/written"] += 1
                c["documents/images_written"] += len(mmc4["image_info"])
                c["documents/words_written"] += len(words_of([[t] for t in mmc4["text_list"]]))
                if len(shown) < 5:
                    shown.append({"url": url, "text_list": mmc4["text_list"][:12],
                                  "images": [(i["matched_text_index"], i["raw_url"]) for i in mmc4["image_info"]]})
                if in_shard >= cfg.samples_per_shard:
                    close_shard()
            faces.close(counts)
        close_shard()
    written = c["documents/written"]
    # What `lait verify` reads each file back against (`lait.stage.file_change`); a rename of the
    # folder keeps the files' times.
    # (On object storage the size decides: `lait.stage.file_change`.)
    files = {f.name: {"bytes": st.st_size, "sha256": storage.sha256_of(f),
                      "mtime_ns": None if remote else st.st_mtime_ns}
             for f in sorted(staging.iterdir()) if f.suffix in (".tar", ".parquet") for st in [f.stat()]}
    stats = {"documents": written, "images": c["documents/images_written"],
             "images_per_document": round(c["documents/images_written"] / written, 3) if written else 0.0,
             "words_per_document": round(c["documents/words_written"] / written, 1) if written else 0.0,
             "images_in_several_documents": sum(1 for n in image_docs.values() if n > 1),
             "shards": shard, "counters": dict(sorted(c.items())), "examples": shown,
             "seconds": round(time.perf_counter() - started, 2),
             "settings": cfg.output_settings(), "files": files}
    (staging / "stats.json").write_text(json.dumps(stats, indent=1, ensure_ascii=False))
    if remote:
        try:
            _publish(staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return stats
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    staging.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return stats


def _publish(local: Path, out: storage.RemotePath) -> None:
    """The finished local folder in place of `out` on object storage: uploaded beside it, the
    earlier files moved aside, the new ones moved in (file by file: storage has no folders)."""
    staging, old = out.with_name(out.name + ".staging"), out.with_name(out.name + ".old")
    fs = storage.filesystem(out)
    storage.remove_tree(staging)
    names = sorted(f.name for f in local.iterdir())
    for name in names:
        fs.put_file(str(local / name), (staging / name).url)
    storage.remove_tree(old)
    if storage.is_dir(out):
        for f in storage.list_dir(out):
            fs.mv(f.url, (old / f.name).url)
    for name in names:
        fs.mv((staging / name).url, (out / name).url)
    storage.remove_tree(old)


def _images_ok(work: WorkDir, urls: set[str]) -> dict[str, dict[str, Any]]:
    """URL -> its images_ok/ row (bytes, format, sizes, digest, the file's rights) for each of
    `urls` stage 2 kept."""
    out: dict[str, dict[str, Any]] = {}
    by_part: dict[int, set[str]] = defaultdict(set)
    for u in urls:
        by_part[partition_of(u, work.n_partitions)].add(u)
    have = set(work.partitions("images_ok"))
    cols = ["image_url", "bytes", "format", "width", "height", "sha256", "rights"]
    for part, group in sorted(by_part.items()):
        if part in have:
            for row in work.iter_rows("images_ok", part, columns=cols, batch_size=64):
                if row["image_url"] in group and row["image_url"] not in out:
                    out[row["image_url"]] = row
    return out


def _document(doc: dict[str, Any], sims_row: dict[str, Any] | None, kept: dict[str, dict[str, Any]],
              cfg: DocumentsConfig, dups: NearDuplicates, opts, faces: FaceSearch, counts: _Counts
              ) -> tuple[tuple[str, str] | None, tuple[dict, dict] | None]:
    """(rule, detail) of the rule that drops the document, or (None, (MMC4 dict, OBELICS row))."""
    paragraphs = doc["paragraphs"]
    words = words_of(paragraphs)
    if len(words) < cfg.min_words:
        return ("too_few_words", f"{len(words)} words, fewer than {cfg.min_words}"), None
    share = repeated_share(paragraphs)
    if share > cfg.max_repeated_share:
        return ("repeated_paragraphs", f"{share:.0%} of {len(paragraphs)} paragraphs repeat another"), None
    hit = dups.seen(doc["page_url"], minhash(words))
    if hit is not None:
        return ("near_duplicate", f"{hit[1]:.0%} of its 5-grams' MinHash agree with {hit[0]}"), None
    sentences = [s for p in paragraphs for s in p]
    para_of = [i for i, p in enumerate(paragraphs) for _ in p]
    urls = sims_row["image_urls"] if sims_row else []
    n_rows = sum(1 for u in urls if u is not None)
    matrix = (np.frombuffer(sims_row["sims"], np.float32).reshape(n_rows, sims_row["n_sentences"])
              if sims_row and n_rows and sims_row["n_sentences"] == len(sentences) else np.zeros((0, len(sentences))))
    row_of = {i: r for r, i in enumerate(i for i, u in enumerate(urls) if u is not None)}
    scored = [i for i, u in enumerate(urls) if u is not None and u in kept and matrix.shape[0]]
    above = [i for i in scored if matrix[row_of[i]].max(initial=-1.0) >= cfg.min_sim]
    if not above:
        why = "no picture of the main text was kept by stage 2" if not scored else \
            f"no picture's best sentence scores {cfg.min_sim:g} or more"
        return ("no_image", why), None
    sub = matrix[[row_of[i] for i in above]]
    chosen = assign(sub)
    placed = sorted((i, chosen[k]) for k, i in enumerate(above) if k in chosen)
    if len(placed) * cfg.min_words_per_image > len(words):
        return ("too_many_images", f"{len(placed)} pictures for {len(words)} words"), None
    page_uid = uid_of(doc["page_url"])
    image_info = []
    matrix_rows: list[int] = []
    shipped_bytes: dict[str, bytes] = {}  # URL -> the picture as written, for the Parquet
    for i, j in placed:
        url = urls[i]
        row = kept[url]
        known = faces.known(row["sha256"], None)
        try:
            shipped = prepare(row["bytes"], row["format"], row["width"], row["height"], opts, known,
                              None if known is not None else faces.finder)
        except Exception as exc:  # undecodable here: the picture leaves, the document goes on
            counts.count("documents/image_unreadable")
            log.info("documents: %s: %s", url, exc)
            continue
        boxes = faces.found(counts, row["sha256"], shipped)
        data = bytes(shipped.data)
        info = {"image_name": f"{uid_of(url, doc['page_url'])}.{shipped.ext}", "raw_url": url,
                "matched_text_index": j, "matched_sim": float(matrix[row_of[i], j]),
                "face_detections": [{"box": b} for b in boxes],
                "image_base64": base64.b64encode(data).decode("ascii"),
                "uid": uid_of(url, doc["page_url"]), "sha256": row["sha256"],
                "width": shipped.width, "height": shipped.height,
                **image_license(doc["images"][i].get("license"), row.get("rights"))}
        image_info.append(info)
        matrix_rows.append(row_of[i])
        shipped_bytes[url] = data
    if not image_info:
        return ("no_image", "no picture could be written"), None
    mmc4 = {"url": doc["page_url"], "uid": page_uid, "text_list": sentences, "image_info": image_info,
            "similarity_matrix": matrix[matrix_rows].round(6).tolist(),
            "license": doc.get("license"), "lang": doc.get("lang"), "title": doc.get("title")}
    # OBELICS: the DOM order (each picture where the page has it), a paragraph per text slot.
    images_col: list[str | None] = []
    bytes_col: list[bytes | None] = []
    texts_col: list[str | None] = []
    meta: list[str | None] = []
    written = {info["raw_url"]: info for info in image_info}
    dom = doc["images"]
    by_after: dict[int, list[dict]] = defaultdict(list)
    for im, u in zip(dom, urls):
        if u in written:
            by_after[im["after"]].append(written[u])
    for k in range(len(paragraphs) + 1):
        for info in by_after.get(k, ()):
            images_col.append(info["raw_url"])
            bytes_col.append(shipped_bytes[info["raw_url"]])
            texts_col.append(None)
            meta.append(json.dumps({"uid": info["uid"], "sha256": info["sha256"], "width": info["width"],
                                    "height": info["height"], "face_detections": info["face_detections"],
                                    "image_license": info["image_license"],
                                    "image_license_from": info["image_license_from"]}))
        if k < len(paragraphs):
            images_col.append(None)
            bytes_col.append(None)
            texts_col.append(" ".join(paragraphs[k]))
            meta.append(None)
    obelics = {"images": images_col, "image_bytes": bytes_col, "texts": texts_col,
               "metadata": json.dumps(meta), "general_metadata": json.dumps(
                   {"url": doc["page_url"], "title": doc.get("title"), "lang": doc.get("lang"),
                    "license": doc.get("license"), "paragraph_of_sentence": para_of}),
               "uid": page_uid, "url": doc["page_url"], "license": doc.get("license")}
    return None, (mmc4, obelics)
