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
from lait.parts import PartitionedWriter, WorkDir

log = logging.getLogger(__name__)

TAG = "score-near-dups"


def find_near_dups(urls: list[str], embs: np.ndarray, threshold: float, k: int) -> list[tuple[str, str, float]]:
    """(url_a, url_b, cosine) with url_a < url_b for every pair within the k-NN at >= threshold."""
    import faiss

    if len(urls) < 2:
        return []
    x = np.ascontiguousarray(embs, np.float32)
    index = faiss.IndexFlatIP(x.shape[1])
    if faiss.get_num_gpus() > 0:
        index = faiss.index_cpu_to_all_gpus(index)
    index.add(x)
    sims, ids = index.search(x, min(k + 1, len(urls)))
    pairs: dict[tuple[str, str], float] = {}
    for i in range(len(urls)):
        for s, j in zip(sims[i], ids[i]):
            if j < 0 or j == i or s < threshold:
                continue
            a, b = sorted((urls[i], urls[j]))
            pairs[(a, b)] = max(pairs.get((a, b), -1.0), float(min(s, 1.0)))
    return sorted((a, b, s) for (a, b), s in pairs.items())


def write_near_dups(work: WorkDir, threshold: float, k: int, fingerprint: str | None = None) -> int:
    """Recompute `near_dups/` from every `image_embs/` partition; returns the number of pairs.
    `fingerprint` (the step's digest) goes into the parts' stats, for the readers' fingerprints."""
    urls: list[str] = []
    chunks = []
    for p in work.partitions("image_embs"):
        t = work.read("image_embs", p, columns=["image_url", "dim", "emb"])
        urls.extend(t.column("image_url").to_pylist())
        chunks.append(stack_embs(t))
    pairs = find_near_dups(urls, np.concatenate(chunks) if chunks else np.zeros((0, 1)), threshold, k)
    work.remove_parts("near_dups", TAG)
    with PartitionedWriter(work, TAG, extra_stats={"fingerprint": fingerprint}) as parts:
        for a, b, s in pairs:
            parts.write("near_dups", parts.partition_of(a), {"image_url_a": a, "image_url_b": b, "cosine": s})
    log.info("score: %d near-duplicate image pairs among %d images (cosine >= %.3f)", len(pairs), len(urls), threshold)
    return len(pairs)
