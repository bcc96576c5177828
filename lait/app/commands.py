"""What every command of the `lait` CLI shares: a sub-command made from a config class, and the
exit code of a stage run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from lait.config import Config
from lait.stage import RunReport


def add_config_command(sub: argparse._SubParsersAction, name: str, config_cls: type[Config],
                       run: Callable[[Any], int], *, help: str, description: str | None = None,
                       epilog: str | None = None) -> argparse.ArgumentParser:
    """A sub-command whose flags are the fields of `config_cls`; `run(config)` does the work."""
    parser = sub.add_parser(name, help=help, description=description or help, epilog=epilog,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    config_cls.add_arguments(parser)
    parser.set_defaults(func=lambda args: run(config_cls.from_args(args)))
    return parser


def report_exit_code(report: RunReport) -> int:
    print(report.summary(), file=sys.stderr)
    return 0 if report.ok else 1
