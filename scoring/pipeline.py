"""`score_work`: the whole of `lait score` over a work directory.

1. Check that the model's weights load, before anything is written.
2. `ScoreStage` over every partition (resumable: finished partitions are skipped).
3. Near-duplicate image pairs over all image embeddings (`near_dups/`).
4. With `regions`: the k-means codebook over all region features, then `RegionLabelStage`.

Steps 3 and 4 are global; they are redone whenever step 2 (re)scored a partition, or when their
completion marker is missing, so a rerun after an interruption ends with a complete output.
"""

from __future__ import annotations

import logging
import os

from lait import storage
from lait.drivers import open_work_dir, record_run
from lait.executor import executor_for
from lait.fingerprint import global_fingerprint
from lait.lock import locked
from lait.parts import WorkDir
from lait.scoring.config import ScoreConfig
from lait.scoring.decode import keeping_pools
from lait.scoring.model import get_scorer, load_scorer, pick_device
from lait.scoring.neardup import write_near_dups
from lait.scoring.regions import CODEBOOK_DIR, CODEBOOK_STEP_NAME, RegionLabelStage, train_codebook
from lait.scoring.stage import ScoreStage
from lait.stage import RunReport, run_global_step

log = logging.getLogger(__name__)

NEAR_DUPS_STEP = "score_near_dups"
CODEBOOK_STEP = CODEBOOK_STEP_NAME


def runs_inline(cfg: ScoreConfig) -> bool:
    """Whether the partitions run in this process (one local worker)."""
    return cfg.executor == "local" and (cfg.workers or os.cpu_count() or 1) == 1


def preflight(cfg: ScoreConfig) -> None:
    """Load the model once here so that missing weights fail before any output exists."""
    if pick_device(cfg.device) == "cpu" or runs_inline(cfg):
        get_scorer(cfg)  # cached: the inline executor (and forked workers) reuse it
    else:
        # CUDA must not be initialised before the executor forks its workers.
        load_scorer(cfg.replace(device="cpu"))


def make_stage_executor(cfg: ScoreConfig, workers: int | None = None):
    """The configured executor. Several local scoring processes are spawned, not forked: this
    process has torch (and its OpenMP pool) initialised, which a forked child can hang on."""
    n = workers or cfg.workers or os.cpu_count() or 1
    local = {"start_method": "spawn" if n > 1 else "fork"} if cfg.executor == "local" else {}
    return executor_for(cfg, workers=n, **local)


def score_work(cfg: ScoreConfig) -> RunReport:
    """Run stage 4 and its global steps over `cfg.work`; returns the scoring run's report."""
    work = open_work_dir(cfg.work, initialized=True)
    with locked(work, "lait score"):  # first: a busy or read-only WORK says so before a model loads
        preflight(cfg)
        with keeping_pools():  # one decode pool for all the partitions this process scores
            report = make_stage_executor(cfg).run(ScoreStage(cfg), work)
        reports = [report]
        if report.ok:
            near_dups_step(work, cfg, report)
            if cfg.regions:
                labels = run_region_labels(work, cfg, report)
                report.failed.update(labels.failed)
                reports.append(labels)
        record_run(work, "score", cfg, reports)
    return report


def near_dups_step(work: WorkDir, cfg: ScoreConfig, report: RunReport) -> None:
    """`near_dups/` over every image embedding, redone when an embedding part or a setting of
    the step changed since it last ran."""
    fp = global_fingerprint(work, NEAR_DUPS_STEP, {"near_dup_threshold": cfg.near_dup_threshold,
                                                    "near_dup_k": cfg.near_dup_k}, ["image_embs"])
    run_global_step(work, fp, lambda: {"pairs": write_near_dups(work, cfg.near_dup_threshold, cfg.near_dup_k,
                                                                fp.digest)},
                    label="score: near-duplicates", force=cfg.force, report=report)


def run_region_labels(work: WorkDir, cfg: ScoreConfig, report: RunReport) -> RunReport:
    """Train the codebook (when its inputs or settings changed) and label every partition's
    regions with it; the labels' fingerprints hold the codebook's, so a new one relabels all."""
    stage = RegionLabelStage()
    fp = global_fingerprint(work, CODEBOOK_STEP, {k: getattr(cfg, k) for k in
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
    if not work.is_done(CODEBOOK_STEP, 0):
        return RunReport(stage.name)
    # Labelling is light (nearest centroid, numpy only): one process is enough.
    return make_stage_executor(cfg, workers=1).run(stage, work)
