"""`lait run`: stages 2 to 5 in one go, with the settings of one pipeline YAML.

    filter:  {min_side: 300}        # FilterConfig   (filters.image_stage)
    clean:   {languages: [en]}      # CleanConfig    (filters.text_stage)
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

from lait.app.steps import STEP_NAMES, STEPS, load_pipeline_yaml
from lait.config import Config, ConfigError

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
                    overrides: dict[str, Any] | None = None, where: str = "pipeline") -> dict[str, Config]:
    """One validated config per step: the YAML section, then `work` and the shared overrides."""
    out = {}
    for step in STEPS:
        if step.name not in steps:
            continue
        cls = step.config_class()
        data = {**sections.get(step.name, {}), "work": work}
        known = {f.name for f, _ in cls._fields()}
        data.update({k: v for k, v in (overrides or {}).items() if v is not None and k in known})
        cfg = cls.from_dict(data, where=f"{where}: {step.name}")
        cfg.validate()
        out[step.name] = cfg
    return out


def run_pipeline(work: str, sections: dict[str, dict], *, steps: list[str] | None = None,
                 overrides: dict[str, Any] | None = None, where: str = "pipeline", note: str | None = None) -> bool:
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

Resumable: every stage skips the partitions that are up to date and redoes those whose settings or
input changed, so rerun the same command after an interruption or a change. It prints `lait
status` first.
"""


def last_settings(work: str) -> tuple[dict[str, dict], list[str]]:
    """The sections of the settings each stage of `work` last completed with
    (`WORK/_configs/STAGE.yaml`, `steps.recorded_settings`), and the files read; empty when the
    directory has none."""
    from lait.app.steps import STEPS, recorded_settings

    sections: dict[str, dict] = {}
    used: list[str] = []
    for step in STEPS:
        data, path = recorded_settings(work, step.name, step.config_class())
        if path is not None:
            sections[step.name] = data
            used.append(f"{step.name}.yaml")
    return sections, used


def run_run(args: argparse.Namespace) -> int:
    steps = STEP_NAMES[STEP_NAMES.index(args.from_stage): STEP_NAMES.index(args.to_stage) + 1]
    if not steps:
        raise ConfigError(f"--from {args.from_stage} comes after --to {args.to_stage}")
    overrides = {"workers": args.workers, "progress": args.progress}
    note = None
    if args.config:
        sections, where = load_pipeline_yaml(args.config), args.config
    else:
        # Without --config a rerun keeps the settings the directory was built with: the defaults
        # would silently redo stages with other settings (and a demo's `model: demo` would be lost).
        sections, used = last_settings(args.work)
        where = f"{args.work}/_configs"
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
    p.add_argument("--config", metavar="YAML", help="pipeline YAML with filter/clean/score/build sections")
    p.add_argument("--from", dest="from_stage", choices=STEP_NAMES, default="filter", help="first stage to run")
    p.add_argument("--to", dest="to_stage", choices=STEP_NAMES, default="build", help="last stage to run")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes of every stage (overrides the YAML)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars on a terminal (default: on)")
    p.set_defaults(func=run_run)
