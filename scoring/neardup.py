"""Near-duplicate images from their embeddings: faiss k-NN over every image of the work directory.

Images are partitioned by URL, so copies of one picture under different URLs sit in different
partitions: this step runs once over all `image_embs/` after the partitions are scored. Each
image's `k` nearest neighbours (inner product of normalised embeddings = cosine) are searched
with an exact flat index (on GPU when faiss-gpu sees one); pairs at or above the threshold go
to `near_dups/` with `image_url_a < image_url_b`, partitioned by `image_url_a`.
"""

from __future__ import annotations

import logging

import numpy as np

from lait.arrays import stack_embs
from lait.fingerprint import global_fingerprint
from lait.parts import PartitionedWriter
from lait.stage import RunReport, run_global_step
from lait.workdir import WorkDir

log = logging.getLogger(__name__)

TAG = "score-near-dups"
NEAR_DUPS_STEP = "score_near_dups"  # its completion marker: _done/score_near_dups/


def knn_inner_product(x: np.ndarray, k: int, backend: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """(similarities, ids) of each row's `k` nearest rows by inner product, exact. `auto`: faiss's
    flat index (on its GPUs when faiss-gpu sees any), else torch on a CUDA device when there is
    one (the GPU images carry torch, not faiss), else torch on the CPU."""
    faiss = None
    if backend in ("auto", "faiss"):
        try:
            import faiss
        except ImportError:
            if backend == "faiss":
                raise
    if faiss is not None and (backend == "faiss" or faiss.get_num_gpus() > 0 or not _cuda()):
        index = faiss.IndexFlatIP(x.shape[1])
        if faiss.get_num_gpus() > 0:
            index = faiss.index_cpu_to_all_gpus(index)
        index.add(x)
        return index.search(x, k)
    import torch

    device = "cuda" if _cuda() else "cpu"
    xt = torch.from_numpy(x).to(device)
    sims, ids = [], []
    step = 8192
    for i in range(0, len(x), step):
        s, j = torch.topk(xt[i: i + step] @ xt.T, k, dim=1)
        sims.append(s.cpu())
        ids.append(j.cpu())
    return torch.cat(sims).numpy(), torch.cat(ids).numpy().astype(np.int64)


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def find_near_dups(urls: list[str], embs: np.ndarray, threshold: float, k: int) -> list[tuple[str, str, float]]:
    """(url_a, url_b, cosine) with url_a < url_b for every pair within the k-NN at >= threshold."""
    a, b, s = near_dup_pairs(urls, embs, threshold, k)
    return [(urls[i], urls[j], float(c)) for i, j, c in zip(a, b, s)]


def near_dup_pairs(urls: list[str], embs: np.ndarray, threshold: float, k: int, backend: str = "auto"
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pairs of `find_near_dups` as index arrays (a, b, cosine), sorted by (url_a, url_b),
    each pair once with its highest cosine."""
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
    if len(urls) < 2:
        return empty
    x = np.ascontiguousarray(embs, np.float32)
    sims, ids = knn_inner_product(x, min(k + 1, len(urls)), backend)
    rows = np.repeat(np.arange(len(urls)), ids.shape[1]).reshape(ids.shape)
    keep = (ids >= 0) & (ids != rows) & (sims >= threshold)
    i, j, s = rows[keep], ids[keep], np.minimum(sims[keep], 1.0).astype(np.float32)
    if not len(i):
        return empty
    order = np.argsort(np.asarray(urls, dtype=object), kind="stable")
    rank = np.empty(len(urls), np.int64)
    rank[order] = np.arange(len(urls))
    # Each pair by its URLs in order; the same pair found from both ends keeps its highest cosine.
    ra, rb = np.minimum(rank[i], rank[j]), np.maximum(rank[i], rank[j])
    by = np.lexsort((-s, rb, ra))
    ra, rb, s = ra[by], rb[by], s[by]
    first = np.ones(len(ra), bool)
    first[1:] = (ra[1:] != ra[:-1]) | (rb[1:] != rb[:-1])
    return order[ra[first]], order[rb[first]], s[first]


def write_near_dups(work: WorkDir, threshold: float, k: int, fingerprint: str | None = None) -> int:
    """Recompute `near_dups/` from every `image_embs/` partition; returns the number of pairs.
    `fingerprint` (the step's digest) goes into the parts' stats, for the readers' fingerprints."""
    import pyarrow as pa

    urls: list[str] = []
    chunks = []
    for p in work.partitions("image_embs"):
        t = work.read("image_embs", p, columns=["image_url", "dim", "emb"])
        urls.extend(t.column("image_url").to_pylist())
        chunks.append(stack_embs(t))
    a, b, s = near_dup_pairs(urls, np.concatenate(chunks) if chunks else np.zeros((0, 1)), threshold, k)
    work.remove_parts("near_dups", TAG)
    with PartitionedWriter(work, TAG, extra_stats={"fingerprint": fingerprint}) as parts:
        if len(a):
            url_a = np.asarray(urls, dtype=object)[a]
            part_of = {u: parts.partition_of(u) for u in set(url_a)}
            dest = np.fromiter((part_of[u] for u in url_a), np.int64, len(url_a))
            url_b = np.asarray(urls, dtype=object)[b]
            for p in np.unique(dest):
                sel = dest == p
                parts.write_table("near_dups", int(p), pa.table({"image_url_a": url_a[sel].tolist(),
                                                                 "image_url_b": url_b[sel].tolist(),
                                                                 "cosine": s[sel]}))
    log.info("score: %d near-duplicate image pairs among %d images (cosine >= %.3f)", len(a), len(urls), threshold)
    return len(a)


def near_dups_step(work: WorkDir, cfg, report: RunReport) -> None:
    """`near_dups/` over every image embedding (a `ScoreConfig`'s threshold and k), redone when
    an embedding part or a setting of the step changed since it last ran."""
    fp = global_fingerprint(work, NEAR_DUPS_STEP, {"near_dup_threshold": cfg.near_dup_threshold,
                                                    "near_dup_k": cfg.near_dup_k}, ["image_embs"])
    run_global_step(work, fp, lambda: {"pairs": write_near_dups(work, cfg.near_dup_threshold, cfg.near_dup_k,
                                                                fp.digest)},
                    label="score: near-duplicates", force=cfg.force, report=report)
