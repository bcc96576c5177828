"""Region tokens from the visual tower's patch features, and their k-means codebook labels.

ImageBERT feeds the transformer region features with 5-d locations and predicts each masked
region's object class (MOC). Without a detector, the regions are cells of the ViT patch grid
(pooled down to at most `max_regions` cells) and the classes are ids of the nearest centroid of
a faiss k-means codebook trained over all region features of the work directory.
"""

from __future__ import annotations

import io
import logging
from typing import Any

import numpy as np

from lait import storage
from lait.arrays import cell_grid, grid_boxes, region_arrays, to_bytes
from lait.fingerprint import global_fingerprint
from lait.parts import PartContext
from lait.stage import RunReport, Stage, run_global_step
from lait.workdir import WorkDir
from lait.writers import atomic_write_bytes, atomic_write_json

log = logging.getLogger(__name__)

# The k-means codebook of region features: WORK/score_codebook/centroids.npy + codebook.json.
CODEBOOK_DIR = "score_codebook"
CODEBOOK_STEP_NAME = "score_codebook"  # its completion marker: _done/score_codebook/


def pool_tokens(tokens: np.ndarray, grid: tuple[int, int], max_regions: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, gh*gw, D) patch tokens -> ((N, R, D) fp16 region features, (R, 4) boxes), R <= max_regions."""
    import torch
    import torch.nn.functional as F

    gh, gw = grid
    n, count, dim = tokens.shape
    if count != gh * gw:
        raise ValueError(f"expected {gh}x{gw} patch tokens, got {count}")
    rows, cols = cell_grid(gh, gw, max_regions)
    if (rows, cols) != (gh, gw):
        t = torch.from_numpy(np.ascontiguousarray(tokens, np.float32)).view(n, gh, gw, dim).permute(0, 3, 1, 2)
        tokens = F.adaptive_avg_pool2d(t, (rows, cols)).permute(0, 2, 3, 1).reshape(n, rows * cols, dim).numpy()
    return tokens.astype(np.float16), grid_boxes(rows, cols)


# ---------------------------------------------------------------------------------------
# Codebook


def _sample_features(work: WorkDir, sample: int, seed: int) -> np.ndarray:
    """A deterministic sample of region features over every partition, in proportion to size."""
    parts = work.partitions("regions")
    counts = {p: sum(work.read("regions", p, columns=["n"]).column("n").to_pylist()) for p in parts}
    total = sum(counts.values())
    if total == 0:
        return np.zeros((0, 0), np.float32)
    chunks = []
    for p in parts:
        feats = np.concatenate([region_arrays(r).features for r in work.iter_rows("regions", p)])
        take = min(len(feats), max(1, round(sample * counts[p] / total)))
        idx = np.sort(np.random.default_rng([seed, p]).choice(len(feats), take, replace=False))
        chunks.append(feats[idx].astype(np.float32))
    return np.concatenate(chunks)


def train_codebook(work: WorkDir, k: int, sample: int, iters: int, seed: int) -> np.ndarray | None:
    """Train the k-means codebook over the work directory's region features and store it."""
    import faiss

    x = _sample_features(work, sample, seed)
    if len(x) == 0:
        return None
    k = min(k, len(x))
    km = faiss.Kmeans(x.shape[1], k, niter=iters, seed=seed, gpu=faiss.get_num_gpus() > 0, verbose=False,
                      min_points_per_centroid=1, max_points_per_centroid=max(256, len(x) // k + 1))
    km.train(x)
    centroids = np.ascontiguousarray(km.centroids, np.float32)
    out = work.root / CODEBOOK_DIR
    buf = _npy_bytes(centroids)
    atomic_write_bytes(out / "centroids.npy", buf)
    atomic_write_json(out / "codebook.json", {"k": k, "dim": int(x.shape[1]), "sample": len(x),
                                              "iters": iters, "seed": seed})
    log.info("score: codebook of %d centroids over %d region features", k, len(x))
    return centroids


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def load_codebook(work: WorkDir) -> np.ndarray:
    with storage.open_input(work.root / CODEBOOK_DIR / "centroids.npy") as f:
        return np.load(f, allow_pickle=False)


def nearest_centroid(features: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Id of the nearest centroid (L2) of each row, int32; exact and deterministic."""
    x = features.astype(np.float32)
    # |x - c|^2 = |x|^2 - 2 x.c + |c|^2; |x|^2 does not change the argmin.
    d = (centroids * centroids).sum(1)[None, :] - 2.0 * x @ centroids.T
    return d.argmin(1).astype(np.int32)


class RegionLabelStage(Stage):
    """Writes `region_labels/`: each region's nearest codebook centroid (the MOC class)."""

    name = "score_labels"
    input_table = "regions"
    output_tables = ("region_labels",)

    def global_inputs(self, work: WorkDir) -> dict[str, Any]:
        """Every partition reads the codebook: a new one relabels them all."""
        marker = work.markers(CODEBOOK_STEP_NAME).get(0) or {}
        return {"codebook": (marker.get("fingerprint") or {}).get("digest")}

    def process(self, ctx: PartContext) -> None:
        centroids = load_codebook(ctx.work)
        for row in ctx.work.iter_rows("regions", ctx.partition):
            labels = nearest_centroid(region_arrays(row).features, centroids)
            ctx.write("region_labels", {"image_url": row["image_url"], "n": row["n"],
                                        "labels": to_bytes(labels, "i4")})


def codebook_step(work: WorkDir, cfg, report: RunReport) -> bool:
    """Train the codebook (a `ScoreConfig`'s k, sample, iterations and seed) when its inputs or
    settings changed; whether a codebook is there for `RegionLabelStage` to label with."""
    fp = global_fingerprint(work, CODEBOOK_STEP_NAME, {k: getattr(cfg, k) for k in
                                                       ("codebook_k", "codebook_sample", "codebook_iters", "seed")},
                            ["regions"])

    def codebook() -> dict[str, int] | None:
        centroids = train_codebook(work, cfg.codebook_k, cfg.codebook_sample, cfg.codebook_iters, cfg.seed)
        if centroids is None:
            log.warning("score: --regions is set but no region features were written")
            storage.remove_tree(work.root / CODEBOOK_DIR)
            return None
        return {"k": int(centroids.shape[0])}

    run_global_step(work, fp, codebook, label="score: codebook", force=cfg.force, report=report)
    return work.is_done(CODEBOOK_STEP_NAME, 0)
