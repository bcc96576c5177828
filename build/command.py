"""`lait build`, `lait stats`, `lait run` and `lait demo` (kept light: heavy imports run inside)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from lait.commands import add_config_command
from lait.config import Config, ConfigError, setting

BUILD_DESCRIPTION = """\
Stage 5 of LAIT: aggregate scored image-text pairs into WebDataset shards.

Groups images by URL, content (sha256) and near-duplicates (perceptual hash, and stage 4's
embedding pairs) across the whole dataset; keeps the best text of each picture (highest score,
ties broken by source) and the next ones as alternatives; drops images with too many texts or
pages (logos) and texts on too many images (boilerplate); thresholds by score or top fraction.

Writes WORK/shards/NNNNN.tar (KEY.jpg, KEY.txt, KEY.json, and KEY.regions.npy/boxes.npy/
labels.npy when stage 4 stored regions), NNNNN.parquet sidecars, sizes.json and stats.json;
every dropped image is in WORK/rejected/ as build/RULE. Deterministic; a rerun reuses finished
shards, and rebuilds when the inputs or these settings changed.
"""

BUILD_EPILOG = """\
examples:
  lait build work/
  lait build work/ --min-score 0.28 --samples-per-shard 10000
  lait build work/ --top-fraction 0.3            keep the best 30 % (DataComp-style)
  lait build work/ --config pipeline.yaml        settings from the `build:` section
"""

RUN_DESCRIPTION = """\
Run stages 2 to 5 (filter, clean, score, build) on a crawled work directory, with the settings
of one YAML file that has a section per stage:

  filter: {min_side: 300}
  clean:  {languages: [en]}
  score:  {model: ViT-B-32, pretrained: laion2b_s34b_b79k}
  build:  {min_score: 0.28, samples_per_shard: 10000}

Resumable: every stage skips what it finished, so rerun the same command after an interruption.
"""


@dataclass
class StatsConfig(Config):
    """Settings of `lait stats`."""

    work: str = setting("", "work directory", positional=True)
    html: str = setting("", "write the HTML report here (one self-contained page)")
    json: bool = setting(False, "print the funnel as JSON instead of text")

    def validate(self) -> None:
        if not self.work:
            raise ConfigError("a work directory is required")


def run_build(cfg) -> int:
    from lait.build.pipeline import build

    result = build(cfg)
    print(result.summary(), file=sys.stderr)
    return 0 if result.ok else 1


def run_stats(cfg: StatsConfig) -> int:
    from lait.build.report import stats_json, summary_text, write_report
    from lait.commands import open_work_dir

    open_work_dir(cfg.work, initialized=True)
    st, page = write_report(cfg.work, cfg.html or None)
    print(stats_json(st) if cfg.json else summary_text(st))
    if page is not None:
        print(f"report: {page}", file=sys.stderr)
    return 0


def run_run(args: argparse.Namespace) -> int:
    from lait.build.runner import STEP_NAMES, load_pipeline_yaml, run_pipeline

    steps = STEP_NAMES[STEP_NAMES.index(args.from_stage): STEP_NAMES.index(args.to_stage) + 1]
    if not steps:
        raise ConfigError(f"--from {args.from_stage} comes after --to {args.to_stage}")
    overrides = {"workers": args.workers, "progress": args.progress}
    ok = run_pipeline(args.work, load_pipeline_yaml(args.config), steps=steps, overrides=overrides,
                      where=args.config or "defaults")
    return 0 if ok else 1


def run_demo(cfg) -> int:
    from lait.build.demo import run_demo as demo

    return demo(cfg)


def register(sub: argparse._SubParsersAction) -> None:
    """Add `build`, `stats`, `run` and `demo` to the `lait` command."""
    from lait.build import demo
    from lait.build.config import BuildConfig

    add_config_command(sub, "build", BuildConfig, run_build,
                       help="stage 5: aggregate scored pairs into WebDataset shards",
                       description=BUILD_DESCRIPTION, epilog=BUILD_EPILOG)
    add_config_command(sub, "stats", StatsConfig, run_stats,
                       help="dataset report: funnel, distributions, samples (text and HTML)",
                       description="Summarise a work directory on the terminal and, with --html, as one "
                                   "self-contained HTML page (plots and thumbnails embedded; opens offline).",
                       epilog="example:\n  lait stats work/ --html report.html")
    names = ["filter", "clean", "score", "build"]
    p = sub.add_parser("run", help="stages 2-5 in one go, resumable", description=RUN_DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example:\n  lait run work/ --config pipeline.yaml\n"
                              "  lait run work/ --config pipeline.yaml --from score")
    p.add_argument("work", metavar="WORK", help="work directory holding pages/ and images/ (from a crawl)")
    p.add_argument("--config", metavar="YAML", help="pipeline YAML with filter/clean/score/build sections")
    p.add_argument("--from", dest="from_stage", choices=names, default="filter", help="first stage to run")
    p.add_argument("--to", dest="to_stage", choices=names, default="build", help="last stage to run")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes of every stage (overrides the YAML)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars on a terminal (default: on)")
    p.set_defaults(func=run_run)
    add_config_command(sub, "demo", demo.DemoConfig, run_demo,
                       help="the whole job offline on a built-in local web: shards + report",
                       description=demo.__doc__,
                       epilog="example:\n  lait demo --out demo/")
