"""lait: build web-scale image-text datasets with the LAIT pipeline and train ImageBERT on them.

The stages live in folders at the repository root (`crawler/`, `filters/`, `scoring/`, `build/`,
`train/`) and are the subpackages `lait.crawler`, `lait.filters`, ... of this one namespace: the
wheel maps them under `lait/`, so an install has a single top-level package. In a checkout
(and an editable install) they are not under `lait/`, so the repository root is added to this
package's search path below.
"""

from pathlib import Path as _Path

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
del _Path, _root
