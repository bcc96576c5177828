"""`lait filter` (stage 2) and `lait clean` (stage 3). Heavy imports happen when a command runs."""

from __future__ import annotations

import argparse

from lait.app.commands import add_config_command, report_exit_code
from lait.drivers import run_stage

FILTER_EPILOG = """\
reads WORK/images/, writes WORK/images_ok/ and WORK/rejected/ (reasons filter/RULE:
status, empty, too_large, svg, not_an_image, decompression_bomb, format, animated, min_side,
aspect_ratio, truncated, corrupt, uninformative, duplicate_sha256, duplicate_phash).
Duplicates are found within a partition. Finished partitions are skipped on a rerun.

example:
  lait filter work/ --min-side 256 --animated first_frame
"""

CLEAN_EPILOG = """\
reads WORK/pages/, writes WORK/candidates/ (partitioned by image URL) and WORK/rejected/
(reasons clean/RULE: status, empty, not_html, too_deep, unparsable, timeout, error, filename, url, boilerplate, word_count,
letters, repetition, language, site_boilerplate, no_text).
Candidate sources: alt, title, aria, figcaption, og, context (main-content sentences next to
the image, found with trafilatura).

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
    from lait.filters.image_stage import FilterConfig
    from lait.filters.text_stage import CleanConfig

    add_config_command(sub, "filter", FilterConfig, _run_filter, epilog=FILTER_EPILOG,
                       help="stage 2: image content filtering (size, aspect, format, duplicates)")
    add_config_command(sub, "clean", CleanConfig, _run_clean, epilog=CLEAN_EPILOG,
                       help="stage 3: candidate texts per image, sentence detection and cleaning")
