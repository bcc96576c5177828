"""`lait build`: stage 5 from the command line (kept light: heavy imports run inside)."""

from __future__ import annotations

import argparse
import sys

from lait.app.commands import add_config_command
from lait.reasons import reasons_help

BUILD_DESCRIPTION = """\
Stage 5 of LAIT: aggregate scored image-text pairs into WebDataset shards.

Groups images by URL, content (sha256) and near-duplicates (perceptual hash, and stage 4's
embedding pairs) across the whole dataset; keeps the best text of each picture (highest score,
ties broken by source) and lists the others as ranked candidates; drops images with too many
texts or pages (logos) and texts on too many images (boilerplate); thresholds by score or top
fraction; with --exclude-eval, drops the copies of an evaluation set's pictures. What passed
every rule but the thresholds stays in WORK/pool/ for `lait select`.

Writes WORK/shards/NNNNN.tar (KEY.jpg, KEY.txt, KEY.json with one type per key, and
KEY.regions.npy/boxes.npy/labels.npy when stage 4 stored regions), NNNNN.parquet sidecars,
NNNNN_stats.json, sizes.json, uids.npy and stats.json (docs/shards.md); images are copied as
fetched unless --resize-mode/--encode-format say otherwise (img2dataset's options). Every
dropped image is in WORK/rejected/ as build/RULE. Deterministic; a rerun reuses finished
shards, and rebuilds when the inputs or these settings changed.
"""

BUILD_EPILOG = f"""\
{reasons_help(["build"])}

examples:
  lait build work/
  lait build work/ --min-score 0.28 --samples-per-shard 10000
  lait build work/ --top-fraction 0.3            keep the best 30 % (DataComp-style)
  lait build work/ --resize-mode center_crop --image-size 224
  lait build work/ --config pipeline.yaml        settings from the `build:` section
  lait build work/ --exclude-eval coco/karpathy.json --exclude-eval-split test
                                                 keep COCO's test photos out (build/eval_overlap)
"""

def run_build(cfg) -> int:
    from lait.build.pipeline import build

    result = build(cfg)
    print(result.summary(), file=sys.stderr)
    return 0 if result.ok else 1


def register(sub: argparse._SubParsersAction) -> None:
    """Add `lait build`."""
    from lait.build.config import BuildConfig

    add_config_command(sub, "build", BuildConfig, run_build,
                       help="stage 5: aggregate scored pairs into WebDataset shards",
                       description=BUILD_DESCRIPTION, epilog=BUILD_EPILOG, continues=True)
