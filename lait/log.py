"""Logging set-up and progress bars shared by every command."""

from __future__ import annotations

import logging
import sys
from typing import Any

from tqdm.auto import tqdm


def setup_logging(verbosity: int = 0) -> None:
    """-q: warnings only; default: info; -v: debug."""
    level = logging.WARNING if verbosity < 0 else logging.INFO if verbosity == 0 else logging.DEBUG
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
        force=True,
    )
    # Third-party libraries are chatty at INFO; keep their warnings only unless -v.
    for name in ("scrapy", "twisted", "trafilatura", "htmldate", "PIL", "filelock", "urllib3",
                 "botocore", "aiobotocore", "s3fs", "fsspec", "faiss"):
        logging.getLogger(name).setLevel(logging.DEBUG if verbosity > 0 else logging.WARNING)


def progress(iterable: Any = None, *, total: int | None = None, desc: str = "", unit: str = "it",
             disable: bool = False, **kwargs: Any) -> tqdm:
    """A tqdm bar on stderr; silent when stderr is not a terminal unless LAIT_PROGRESS=1."""
    import os

    if not disable and not sys.stderr.isatty() and os.environ.get("LAIT_PROGRESS") != "1":
        disable = True
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=disable, dynamic_ncols=True,
                file=sys.stderr, **kwargs)
