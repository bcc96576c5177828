"""`lait filter` (stage 2) and `lait clean` (stage 3). Heavy imports happen when a command runs."""

from __future__ import annotations

import argparse

from lait.app.commands import add_config_command, add_unavailable_command, report_exit_code
from lait.drivers import run_stage
from lait.reasons import reasons_help

FILTER_EPILOG = f"""\
reads WORK/images/, writes WORK/images_ok/ and WORK/rejected/.
Duplicates are found within a partition. A rerun redoes only the partitions whose settings or
input changed since they were made, and says why (--force redoes all; `lait status` shows it).

{reasons_help(["filter"])}

example:
  lait filter work/ --min-side 256 --animated first_frame
"""

CLEAN_EPILOG = f"""\
reads WORK/pages/, writes WORK/candidates/ (partitioned by image URL) and WORK/rejected/.
Candidate sources: alt, title, aria, figcaption, og, context (main-content sentences next to
the image, found with trafilatura).

{reasons_help(["clean"])}

example:
  lait clean work/ --languages en de fr --min-words 3
"""


def _run_filter(cfg) -> int:
    from lait.filters.image_stage import ImageFilterStage

    return report_exit_code(run_stage(ImageFilterStage(cfg), cfg, "filter"))


def _run_clean(cfg) -> int:
    from lait.filters.text_stage import CleanStage

    return report_exit_code(run_stage(CleanStage(cfg), cfg, "clean"))


def register(sub: argparse._SubParsersAction) -> None:
    from lait.filters.config import FilterConfig

    add_config_command(sub, "filter", FilterConfig, _run_filter, epilog=FILTER_EPILOG, continues=True,
                       help="stage 2: image content filtering (size, aspect, format, duplicates)")
    clean_help = "stage 3: candidate texts per image, sentence detection and cleaning"
    try:  # stage 3 reads pages with the crawler's packages, which a GPU image may lack
        from lait.filters.config import CleanConfig
    except ImportError as exc:
        add_unavailable_command(sub, "clean", exc, help=clean_help)
    else:
        add_config_command(sub, "clean", CleanConfig, _run_clean, epilog=CLEAN_EPILOG, help=clean_help,
                           continues=True)
