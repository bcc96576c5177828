"""`lait run`: stages 2 to 5 in one go, with the settings of one pipeline YAML.

    filter:  {min_side: 300}        # FilterConfig   (filters.config)
    clean:   {languages: [en]}      # CleanConfig    (filters.config)
    score:   {model: ViT-B-32, pretrained: laion2b_s34b_b79k}   # ScoreConfig (scoring.config)
    build:   {samples_per_shard: 10000, min_score: 0.28}        # BuildConfig (build.config)

Every stage skips the partitions it finished before (completion markers), so rerunning the
same command after an interruption continues where it stopped. Stage modules are imported
only when their step runs, so `lait --help` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any, Callable

from lait.app.steps import STEP_NAMES, STEPS, pipeline_sections, recorded_sections
from lait.config import MAX_CONFIG_TEXT, Config, ConfigError

log = logging.getLogger(__name__)


def _run_filter(cfg: Any) -> bool:
    from lait.drivers import run_stage
    from lait.filters.image_stage import ImageFilterStage

    report = run_stage(ImageFilterStage(cfg), cfg, "filter")
    print(report.summary(), file=sys.stderr)
    return report.ok


def _run_clean(cfg: Any) -> bool:
    from lait.drivers import run_stage
    from lait.filters.text_stage import CleanStage

    report = run_stage(CleanStage(cfg), cfg, "clean")
    print(report.summary(), file=sys.stderr)
    return report.ok


def _run_score(cfg: Any) -> bool:
    from lait.app.score import prepare_demo_scorer
    from lait.scoring.pipeline import score_work

    prepare_demo_scorer(cfg)
    report = score_work(cfg)
    print(report.summary(), file=sys.stderr)
    return report.ok


def _run_build(cfg: Any) -> bool:
    from lait.build.pipeline import build

    result = build(cfg)
    print(result.summary(), file=sys.stderr)
    return result.ok


RUNNERS: dict[str, Callable[[Any], bool]] = {
    "filter": _run_filter, "clean": _run_clean, "score": _run_score, "build": _run_build,
}


def resolve_configs(work: str, sections: dict[str, dict], steps: list[str],
                    overrides: dict[str, Any] | None = None, where: str | dict[str, str] = "pipeline"
                    ) -> dict[str, Config]:
    """One validated config per step: the YAML section, then `work` and the shared overrides.
    `where`: what a mistake is said to be in, for every step or by step name."""
    out = {}
    for step in STEPS:
        if step.name not in steps:
            continue
        cls = step.config_class()
        data = {**sections.get(step.name, {}), "work": work}
        known = {f.name for f, _ in cls._fields()}
        data.update({k: v for k, v in (overrides or {}).items() if v is not None and k in known})
        place = where.get(step.name, "pipeline") if isinstance(where, dict) else where
        cfg = cls.from_dict(data, where=f"{place}: {step.name}")
        cfg.validate()
        out[step.name] = cfg
    return out


def run_pipeline(work: str, sections: dict[str, dict], *, steps: list[str] | None = None,
                 overrides: dict[str, Any] | None = None, where: str | dict[str, str] = "pipeline",
                 note: str | None = None) -> bool:
    """Run the steps in order; stops at the first that fails. Returns True when all succeeded.
    `note`: a line saying where the settings come from, printed once the run holds the work directory."""
    from lait.app.status import status_text
    from lait.drivers import open_work_dir
    from lait.lock import locked, say_when_held

    steps = steps or STEP_NAMES
    try:
        work_dir = open_work_dir(work, initialized=True)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; crawl into it first") from None
    # Resolve every config first, so a typo in `build:` fails before an hour of scoring.
    configs = resolve_configs(work, sections, steps, overrides, where)
    if note:
        say_when_held(note)  # a refused run (busy, read-only) says its one line alone
    with locked(work_dir, "lait run"):
        print(status_text(work, {name: cfg.to_dict() for name, cfg in
                                 resolve_configs(work, sections, STEP_NAMES, overrides, where).items()}),
              file=sys.stderr, flush=True)
        return _run_steps(configs)


def _run_steps(configs: dict[str, Config]) -> bool:
    for name, cfg in configs.items():
        start = time.perf_counter()
        print(f"lait run: {name} ...", file=sys.stderr, flush=True)
        if not RUNNERS[name](cfg):
            print(f"lait run: {name} failed; fix the cause and rerun (finished partitions are kept)",
                  file=sys.stderr)
            return False
        log.info("%s finished in %.1f s", name, time.perf_counter() - start)
    return True


RUN_DESCRIPTION = """\
Run stages 2 to 5 (filter, clean, score, build) on a crawled work directory, with the settings
of one YAML file that has a section per stage:

  filter: {min_side: 300}
  clean:  {languages: [en]}
  score:  {model: ViT-B-32, pretrained: laion2b_s34b_b79k}
  build:  {min_score: 0.28, samples_per_shard: 10000}

A stage the file has a section for runs with that section over the defaults; a stage it has no
section for continues with the settings the work directory was last made with by it
(WORK/_configs/STAGE.yaml, as `lait STAGE WORK` without --config does), else the defaults. So
a file about stage 5 does not redo stage 2 with other settings; an empty section (`filter: {}`)
asks for the defaults. Without --config every stage continues so.

Resumable: every stage skips the partitions that are up to date and redoes those whose settings or
input changed, so rerun the same command after an interruption or a change. It prints `lait
status` first.
"""


def run_run(args: argparse.Namespace) -> int:
    steps = STEP_NAMES[STEP_NAMES.index(args.from_stage): STEP_NAMES.index(args.to_stage) + 1]
    if not steps:
        raise ConfigError(f"--from {args.from_stage} comes after --to {args.to_stage}")
    overrides = {"workers": args.workers, "progress": args.progress}
    recorded = f"{args.work}/_configs"
    if args.config:
        # A stage the file has no section for continues as `lait STAGE WORK` would: with the
        # settings it last completed with, not the defaults (which would silently redo it).
        sections, used = pipeline_sections(args.work, args.config)
        where = {name: recorded if name in sections and f"{name}.yaml" in used else args.config
                 for name in STEP_NAMES}
        kept = [u.removesuffix(".yaml") for u in used]
        note = (f"lait run: {args.config} has no section for {', '.join(kept)}: continuing with the settings "
                f"{args.work} was last made with ({recorded}/: {', '.join(used)}); an empty section "
                f"(`{kept[0]}: {{}}`) means the defaults") if used else None
    else:
        # Without --config a rerun keeps the settings the directory was built with: the defaults
        # would silently redo stages with other settings (and a demo's `model: demo` would be lost).
        sections, used = recorded_sections(args.work)
        where = recorded
        if used:
            rest = "" if len(used) == len(STEP_NAMES) else "; the defaults for the other stages"
            note = (f"lait run: no --config given: using the settings {args.work} was last built with "
                    f"({where}/: {', '.join(used)}{rest})")
        else:
            note = "lait run: no --config given and no earlier settings in the work directory: the defaults"
    ok = run_pipeline(args.work, sections, steps=steps, overrides=overrides, where=where, note=note)
    return 0 if ok else 1


def register(sub: argparse._SubParsersAction) -> None:
    """Add `lait run`."""
    p = sub.add_parser("run", help="stages 2-5 in one go, resumable", description=RUN_DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example:\n  lait run work/ --config pipeline.yaml\n"
                              "  lait run work/ --config pipeline.yaml --from score")
    p.add_argument("work", metavar="WORK", help="work directory holding pages/ and images/ (from a crawl)")
    p.add_argument("--config", metavar="YAML",
                   help=f"pipeline YAML with filter/clean/score/build sections (at most {MAX_CONFIG_TEXT}); "
                        "a stage without one continues with its recorded settings")
    p.add_argument("--from", dest="from_stage", choices=STEP_NAMES, default="filter", help="first stage to run")
    p.add_argument("--to", dest="to_stage", choices=STEP_NAMES, default="build", help="last stage to run")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes of every stage (overrides the YAML)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars on a terminal (default: on)")
    p.set_defaults(func=run_run)
