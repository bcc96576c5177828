"""`score_work`: the whole of `lait score` over a work directory, through the one launcher
(`lait.drivers.run_stage`) like every stage:

1. `ScoreStage.preflight`: the model's weights load, before anything is written.
2. `ScoreStage` over every partition (resumable: finished partitions are skipped).
3. Its after-steps: near-duplicate image pairs over all image embeddings (`near_dups/`,
   `lait.scoring.neardup.near_dups_step`); with `regions`, the k-means codebook over all region
   features (`lait.scoring.regions.codebook_step`), then `RegionLabelStage`.

Step 3 is global; it is redone whenever step 2 (re)scored a partition, or when its completion
marker is missing, so a rerun after an interruption ends with a complete output.
"""

from __future__ import annotations

from lait.drivers import run_stage
from lait.scoring.config import ScoreConfig
from lait.scoring.stage import ScoreStage
from lait.stage import RunReport


def score_work(cfg: ScoreConfig) -> RunReport:
    """Run stage 4 and its global steps over `cfg.work`; returns the scoring run's report."""
    return run_stage(ScoreStage(cfg), cfg, "score")
