"""Logging set-up and progress bars shared by every command."""

from __future__ import annotations

import logging
import sys
from typing import Any

from tqdm.auto import tqdm


def setup_logging(verbosity: int = 0) -> None:
    """-q: warnings only; default: lait's info and everyone's warnings; -v: debug, everyone's."""
    level = logging.WARNING if verbosity < 0 else logging.INFO if verbosity == 0 else logging.DEBUG
    logging.basicConfig(
        level=level if verbosity > 0 else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
        force=True,
    )
    # Third-party libraries are chatty at INFO (matplotlib's first font cache, Ray, faiss...):
    # at the default verbosity only lait's own loggers say more than warnings. Those libraries
    # that set a level of their own are held to warnings by name too.
    logging.getLogger("lait").setLevel(level)
    for name in ("scrapy", "twisted", "trafilatura", "htmldate", "PIL", "filelock", "urllib3",
                 "botocore", "aiobotocore", "s3fs", "fsspec", "faiss", "matplotlib"):
        logging.getLogger(name).setLevel(logging.DEBUG if verbosity > 0 else logging.WARNING)


def progress(iterable: Any = None, *, total: int | None = None, desc: str = "", unit: str = "it",
             disable: bool = False, **kwargs: Any) -> tqdm:
    """A tqdm bar on stderr; silent when stderr is not a terminal unless LAIT_PROGRESS=1."""
    import os

    if not disable and not sys.stderr.isatty() and os.environ.get("LAIT_PROGRESS") != "1":
        disable = True
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=disable, dynamic_ncols=True,
                file=sys.stderr, **kwargs)
