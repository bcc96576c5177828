"""`lait stats`: the dataset report of a work directory, on the terminal and as one HTML page."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from lait.app.commands import add_config_command
from lait.config import Config, ConfigError, setting


@dataclass
class StatsConfig(Config):
    """Settings of `lait stats`."""

    work: str = setting("", "work directory", positional=True)
    html: str = setting("", "write the HTML report here (one self-contained page)")
    json: bool = setting(False, "print the funnel as JSON instead of text")

    def validate(self) -> None:
        if not self.work:
            raise ConfigError("a work directory is required")


def check_writable(html: str) -> None:
    """A ConfigError, naming the cause, when the report cannot be written to `html`."""
    path = Path(html)
    if path.is_dir():
        raise ConfigError(f"--html {html} is a folder; give the file to write, e.g. {path / 'report.html'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--html {html}: cannot create the folder {path.parent}: "
                          f"{exc.strerror or exc}") from None
    if not os.access(path.parent, os.W_OK):
        raise ConfigError(f"--html {html}: the folder {path.parent} is not writable")


def run_stats(cfg: StatsConfig) -> int:
    from lait.app.report import stats_json, summary_text, write_report
    from lait.drivers import open_work_dir

    open_work_dir(cfg.work, initialized=True)
    if cfg.html:
        check_writable(cfg.html)  # before reading the tables and drawing the plots
    try:
        st, page = write_report(cfg.work, cfg.html or None)
    except OSError as exc:
        raise ConfigError(f"cannot write the report to {cfg.html}: {exc.strerror or exc}") from None
    print(stats_json(st) if cfg.json else summary_text(st))
    if page is not None:
        print(f"report: {page}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `lait stats`."""
    add_config_command(sub, "stats", StatsConfig, run_stats,
                       help="dataset report: funnel, distributions, samples (text and HTML)",
                       description="Summarise a work directory on the terminal and, with --html, as one "
                                   "self-contained HTML page (plots and thumbnails embedded; opens offline).",
                       epilog="example:\n  lait stats work/ --html report.html")
