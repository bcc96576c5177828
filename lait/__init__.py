"""lait: build web-scale image-text datasets with the LAIT pipeline and train ImageBERT on them.

The stages live in folders at the repository root (`crawler/`, `filters/`, `scoring/`, `build/`,
`train/`) and are the subpackages `lait.crawler`, `lait.filters`, ... of this one namespace: the
wheel maps them under `lait/`, so an install has a single top-level package. In a checkout
(and an editable install) they are not under `lait/`, so the repository root is added to this
package's search path below.
"""

import os as _os
from pathlib import Path as _Path

# OpenMP threads that wait for work sleep instead of spinning (GNU OpenMP, which torch's CPU
# kernels run on, spins by default). Beside another busy process, spinning threads take the
# cores the working ones need: a short demo-scorer training here took 1.8x the wall and 1.6x
# the CPU time of a quiet run beside a busy loop, and 1.5x / 1.0x with this; quiet, it is no
# slower (docs/performance.md, "A busy machine"). Set before torch loads its OpenMP runtime,
# and inherited by every process lait starts; a value the user set is kept.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
# [project.urls] of pyproject.toml: the crawler's user agent points site owners here.
HOMEPAGE = "https://github.com/lait-project/lait"
SITE_OWNERS_URL = HOMEPAGE + "#for-site-owners"

_root = _Path(__file__).resolve().parent.parent
# Only in a checkout of lait itself: an installed lait has its stages inside this folder, and the
# folder above it (site-packages) may hold unrelated packages named `build` or `train`.
if not (_Path(__file__).resolve().parent / "crawler").is_dir() and (_root / "crawler" / "spiders").is_dir() \
        and (_root / "pyproject.toml").is_file():
    __path__.append(str(_root))
del _os, _Path, _root
