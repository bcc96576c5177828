"""`lait select`: new shards from a built work directory's scored pool, without rescoring."""

from __future__ import annotations

import argparse
import sys

from lait.app.commands import add_config_command

SELECT_DESCRIPTION = """\
Score once, select many: write the samples of a subset of the pool that `lait build` scored
and grouped into shards of their own, without running any model or regrouping anything.

The pool is every picture that passed the build's rules before its score thresholds. A
selection keeps pool samples by --min-score, --top-fraction (after min-score) and --uids (a
DataComp subset file: a .npy of sorted u8,u8 uids; or a text file of hex uids), and drops the
copies of an evaluation set's pictures with --exclude-eval (OUT/_select/rejected/). With the
build's thresholds it writes the build's very samples. OUT gets NNNNN.tar, NNNNN.parquet,
NNNNN_stats.json, sizes.json, stats.json and uids.npy (what it selected, in DataComp's format).
Images can be resized and re-encoded on the way (img2dataset's options). Resumable.
"""

SELECT_EPILOG = """\
examples:
  lait select work/ --out sel-028/ --min-score 0.28
  lait select work/ --out top30/ --top-fraction 0.3                 DataComp's CLIP-score baseline
  lait select work/ --out again/ --uids top30/uids.npy              the same samples again
  lait select work/ --out small/ --resize-mode center_crop --image-size 224
  lait select work/ --out clean/ --exclude-eval eval-photos/        without an evaluation set's pictures
  lait select work/ --out basic/ --recipe datacomp-basic            DataComp's basic filter
  lait select work/ --out both/ --recipe datacomp-basic --recipe clip-top30      their intersection
  lait select work/ --out mine/ --recipe my-metaclip.yaml           a copy of a shipped recipe, changed
"""


def recipes_help() -> str:
    """The shipped recipes with their descriptions, where their files are, and the reasons the
    recipes' steps record."""
    from lait.build.curate import RECIPE_DIR, builtin_recipes
    from lait.reasons import describe, reasons_of

    return (f"curation recipes (--recipe NAME; the YAML files are in {RECIPE_DIR}: copy one and change it):\n"
            + describe(builtin_recipes()) + "\n\nsamples a recipe leaves out go to OUT/_select/rejected/ "
            "with one of these reasons (and their counts per step to OUT/stats.json):\n"
            + describe(reasons_of("select")))


def run_select(cfg) -> int:
    from lait.build.select import select

    result = select(cfg)
    print(result.summary(), file=sys.stderr)
    return 0 if result.ok else 1


def register(sub: argparse._SubParsersAction) -> None:
    """Add `lait select`."""
    from lait.build.config import SelectConfig

    add_config_command(sub, "select", SelectConfig, run_select,
                       help="new shards from the scored pool: by score, top fraction or DataComp uids",
                       description=SELECT_DESCRIPTION, epilog=SELECT_EPILOG + "\n" + recipes_help())
