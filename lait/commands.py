"""Shared plumbing of the stage commands: parser from a config class, resolve, run, report."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from lait.config import Config, StageConfig
from lait.executor import RunReport, make_executor
from lait.parts import WorkDir
from lait.stage import Stage

log = logging.getLogger(__name__)


def add_config_command(sub: argparse._SubParsersAction, name: str, config_cls: type[Config],
                       run: Callable[[Any], int], *, help: str, description: str | None = None,
                       epilog: str | None = None) -> argparse.ArgumentParser:
    """A sub-command whose flags are the fields of `config_cls`; `run(config)` does the work."""
    parser = sub.add_parser(name, help=help, description=description or help, epilog=epilog,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    config_cls.add_arguments(parser)
    parser.set_defaults(func=lambda args: run(config_cls.from_args(args)))
    return parser


def run_stage(stage: Stage, cfg: StageConfig, command: str) -> RunReport:
    """Run a stage over the work directory with the executor the config names."""
    work = WorkDir(cfg.work)
    if not work.root.is_dir():
        from lait.config import ConfigError

        raise ConfigError(f"work directory not found: {work.root}")
    work.write_config(command, cfg.to_yaml())
    executor = make_executor(cfg.executor, ray_address=cfg.ray_address, workers=cfg.workers or None,
                             retries=cfg.retries, show_progress=cfg.progress)
    return executor.run(stage, work)


def report_exit_code(report: RunReport) -> int:
    print(report.summary(), file=sys.stderr)
    return 0 if report.ok else 1
