"""SemDeDup (Abbas et al., 2023): semantic deduplication on image embeddings.

k-means over the (L2-normalised) embeddings, then, inside each cluster, items are visited best
first and one is dropped when its cosine similarity to an item already kept exceeds 1 - eps. So
no two kept items of a cluster are closer than that, and every group of near-copies keeps its
first member.

The clusters are made by hierarchical k-means: a cluster larger than `cluster_size` is split
again by a k-means of at most `branch` centroids. Each level costs O(n * branch) and there are
O(log n) levels (base `branch`), so clustering grows as n log n, where one
flat k-means with n / cluster_size centroids would grow as n^2; the greedy pass inside a cluster
costs O(cluster_size) per item.

Every product here is small (a cluster of at most a few thousand rows against itself, a block of
rows against at most `branch` centroids), so the step runs on one BLAS thread: split across
threads such products cost more in synchronisation than they gain, and on a loaded machine
OpenBLAS's waiting threads made the same 100k run 2 to 6 times slower (docs/performance.md). Run
several selections side by side (processes or Ray) to use more cores.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import wraps

import numpy as np
from threadpoolctl import threadpool_limits

# Up to this many rows a cluster is compared as one similarity matrix (4096^2 float32: 64 MiB).
MATRIX_MAX = 4096


def normalise(x: np.ndarray) -> np.ndarray:
    """Unit rows as float32, in a new array (one copy: the input is never changed)."""
    x = np.array(x, np.float32)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return x


def one_blas_thread(fn):
    """Run `fn` with BLAS limited to one thread (see the module's docstring)."""
    @wraps(fn)
    def run(*args, **kwargs):
        with threadpool_limits(limits=1, user_api="blas"):
            return fn(*args, **kwargs)
    return run


def seeds(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding (each next seed drawn with probability proportional to its squared
    distance to the nearest seed so far): it seldom puts two seeds into one tight group of
    near-copies, which would split the group across clusters where no pass compares them."""
    chosen = [int(rng.integers(len(x)))]
    d2 = np.maximum(2.0 - 2.0 * (x @ x[chosen[0]]), 0.0)
    for _ in range(1, k):
        total = d2.sum()
        if total <= 0:
            break  # every row is one of the seeds already
        nxt = int(rng.choice(len(x), p=d2 / total))
        chosen.append(nxt)
        d2 = np.minimum(d2, np.maximum(2.0 - 2.0 * (x @ x[nxt]), 0.0))
    return x[chosen].copy()


def nearest(x: np.ndarray, centroids: np.ndarray, cells: int = 1 << 24) -> np.ndarray:
    """The centroid of highest cosine for each row, in row blocks of bounded memory."""
    step = max(1, cells // max(1, len(centroids)))
    return np.concatenate([np.argmax(x[i:i + step] @ centroids.T, axis=1) for i in range(0, len(x), step)]) \
        if len(x) else np.zeros(0, np.int64)


def cluster_sums(x: np.ndarray, assign: np.ndarray, k: int, cells: int = 1 << 24) -> tuple[np.ndarray, np.ndarray]:
    """The sum of each cluster's rows, and which clusters have any: one-hot matmuls over row
    blocks of bounded memory (a sorted copy of `x` would double the peak)."""
    sums = np.zeros((k, x.shape[1]), np.float32)
    step = max(1, cells // k)
    for i in range(0, len(x), step):
        block = assign[i:i + step]
        onehot = np.zeros((len(block), k), np.float32)
        onehot[np.arange(len(block)), block] = 1.0
        sums += onehot.T @ x[i:i + step]
    return sums, np.bincount(assign, minlength=k) > 0


def kmeans(x: np.ndarray, k: int, rng: np.random.Generator, iters: int = 10, centroids_too: bool = False,
           points_per_centroid: int = 256):
    """Spherical k-means of the rows of `x` (normalised): the cluster of each row (and the
    centroids, with `centroids_too`). As faiss does, the centroids are trained on a random
    sample of at most `points_per_centroid` rows per centroid; then every row is assigned once,
    so a large input costs one pass, not one per iteration."""
    k = min(k, len(x))
    train = x
    if len(x) > points_per_centroid * k:
        train = x[np.sort(rng.choice(len(x), points_per_centroid * k, replace=False))]
    centroids = seeds(train, k, rng)
    k = len(centroids)
    assign = np.zeros(len(train), np.int64)
    for _ in range(iters):
        new = nearest(train, centroids)
        if _ and np.array_equal(new, assign):
            break
        assign = new
        sums, filled = cluster_sums(train, assign, k)
        centroids[filled] = normalise(sums[filled])  # an empty cluster keeps its centroid
    if train is not x:
        assign = nearest(x, centroids)
    return (assign, centroids) if centroids_too else assign


def clusters(x: np.ndarray, cluster_size: int, branch: int = 16, seed: int = 0) -> list[np.ndarray]:
    """Row indices of `x` in clusters of at most `cluster_size` (unless k-means cannot split a
    cluster further: its rows are then one point, and the greedy pass is linear on it)."""
    rng = np.random.default_rng(seed)
    todo = [np.arange(len(x))]
    done: list[np.ndarray] = []
    while todo:
        idx = todo.pop()
        if len(idx) <= cluster_size:
            done.append(idx)
            continue
        # As few centroids as make clusters of cluster_size, at most `branch`: every level a
        # near-copy pair goes through is a boundary that may split it.
        k = min(branch, max(2, -(-len(idx) // cluster_size)))
        assign = kmeans(x if len(idx) == len(x) else x[idx], k, rng)  # no copy of the whole input
        parts = [idx[assign == c] for c in np.unique(assign)]
        if len(parts) == 1:
            done.append(idx)
        else:
            todo.extend(parts)
    return done


def dedup_cluster(x: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Greedy pass over the rows of `x` in order: for each row, whether it is kept and, for a
    dropped one, the (first) kept row it is too close to (-1 for a kept row)."""
    n = len(x)
    kept = np.zeros(n, bool)
    by = np.full(n, -1, np.int64)
    alive = np.ones(n, bool)
    # One similarity matrix for a cluster of the planned size; row by row for a cluster k-means
    # could not split (copies of one picture), which would not fit as a matrix.
    sims = x @ x.T if n <= MATRIX_MAX else None
    visit = range(n)
    if sims is not None:
        np.fill_diagonal(sims, -1.0)
        close_any = (sims > threshold).any(axis=1)
        kept[~close_any] = True  # a row with no close row is kept, and drops none
        visit = np.flatnonzero(close_any)
    for i in visit:
        if not alive[i]:
            continue
        kept[i] = True
        row = sims[i, i + 1:] if sims is not None else x[i + 1:] @ x[i]
        close = np.flatnonzero(alive[i + 1:] & (row > threshold)) + i + 1
        alive[close] = False
        by[close] = i
    return kept, by


@dataclass
class DedupResult:
    keep: np.ndarray        # bool per item
    duplicate_of: np.ndarray  # int64 per item: the kept item it duplicates, -1 when kept
    similarity: np.ndarray  # float32 per item: cosine to that item (nan when kept)
    cluster: np.ndarray     # int64 per item: its cluster in the last pass (-1: dropped before it)
    n_clusters: int


@one_blas_thread
def semdedup(emb: np.ndarray, eps: float, priority: np.ndarray | None = None, cluster_size: int = 1000,
             branch: int = 16, seed: int = 0, passes: int = 1) -> DedupResult:
    """SemDeDup of `emb` (n x d). `priority` orders the items inside a cluster (lower first,
    e.g. minus the score, so that each group keeps its best-scoring member); by index without.
    `passes` > 1 clusters what the pass before kept again, with another seed: near-copies that
    one clustering put on two sides of a boundary seldom are in the next (SemDeDup is one pass)."""
    x = normalise(emb)
    n = len(x)
    keep = np.ones(n, bool)
    dup = np.full(n, -1, np.int64)
    sim = np.full(n, np.nan, np.float32)
    cluster = np.zeros(n, np.int64)
    n_clusters = 0
    for p in range(passes):
        alive = np.flatnonzero(keep)
        groups = [alive[g] for g in clusters(x[alive], cluster_size, branch, seed + p)] if len(alive) else []
        cluster[:] = -1
        for c, idx in enumerate(groups):
            cluster[idx] = c
            if priority is not None:
                idx = idx[np.lexsort((idx, priority[idx]))]
            else:
                idx = np.sort(idx)
            kept, by = dedup_cluster(x[idx], 1.0 - eps)
            dropped = np.flatnonzero(~kept)
            keep[idx[dropped]] = False
            dup[idx[dropped]] = idx[by[dropped]]
            sim[idx[dropped]] = np.einsum("ij,ij->i", x[idx[dropped]], x[idx[by[dropped]]])
        n_clusters = len(groups)
    return DedupResult(keep, dup, sim, cluster, n_clusters)
