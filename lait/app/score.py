"""`lait score`: stage 4 from the command line (kept light: torch loads only when it runs)."""

from __future__ import annotations

import argparse
import logging

from lait.app.commands import add_config_command, report_exit_code
from lait.reasons import reasons_help
from lait.scoring.config import ScoreConfig

log = logging.getLogger(__name__)

DESCRIPTION = """\
Stage 4 of LAIT: score every (image, text) candidate pair with an open_clip model.

Joins candidates/ with images_ok/ partition by partition and writes scored/ (one row per pair
with the cosine of the image and text embeddings), image_embs/ and text_embs/ (fp16,
normalised), near_dups/ (image pairs whose embeddings are nearly equal, for stage 5), and with
--regions the region tokens (regions/, region_labels/, score_codebook/) that ImageBERT reads.
"""

EPILOG = f"""\
weights:
  lait score work/ --model ViT-B-32 --pretrained laion2b_s34b_b79k   open_clip tag (needs internet once)
  lait score work/ --model ViT-B-32 --checkpoint open_clip_model.safetensors
  lait score work/ --model local-dir:/models/my-clip                 open_clip model folder
  lait score work/ --model demo            offline demo scorer for the built-in web (built on first use)
  lait score --build-demo-model            only build the demo scorer, print its folder
Weights that cannot be loaded stop the command (exit 2); random weights need allow_random_init.

examples:
  lait score work/ --regions --codebook-k 512         region tokens and MOC labels for training
  lait score work/ --config pipeline.yaml             settings from the `score:` section

{reasons_help(["score"])}
"""


def prepare_demo_scorer(cfg: ScoreConfig) -> None:
    """`--model demo` scores with the test kit's offline scorer: build it on first use."""
    if cfg.model == "demo" or cfg.build_demo_model:
        from lait.testkit.demo_scorer import ensure_demo_model

        ensure_demo_model(cfg.demo_dir or None)


def run(cfg: ScoreConfig) -> int:
    prepare_demo_scorer(cfg)
    if cfg.build_demo_model:
        from lait.scoring.model import demo_scorer_dir

        print(demo_scorer_dir(cfg.demo_dir or None))
        return 0
    from lait.scoring.pipeline import score_work

    return report_exit_code(score_work(cfg))


def register(sub: argparse._SubParsersAction) -> None:
    add_config_command(sub, "score", ScoreConfig, run, continues=True,
                       help="stage 4: score image-text pairs with open_clip",
                       description=DESCRIPTION, epilog=EPILOG)

