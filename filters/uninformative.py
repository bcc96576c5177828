"""The uninformative-image hook: logos, icons, charts, blank images.

A classifier is any object with `name` and `judge(preview) -> (is_uninformative, detail)` taking
a `lait.filters.image_decode.Preview` (`.image`: small upright RGB, 32 to 256 px; `.nearest`: 64x64
nearest-neighbour samples). The default, `FlatColourHeuristic`, flags synthetic graphics by how
few exact colours they use: a photograph's sensor noise gives dozens to hundreds of colours in
64x64 nearest-neighbour samples (even of a 1/8-scale JPEG decode), while a logo, icon, chart or
blank image has a handful. A learned classifier (say a linear probe on CLIP embeddings) plugs
in as `--uninformative my.module:MyClassifier`; it is constructed once per worker process.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from lait.config import ConfigError
from lait.filters.image_decode import Preview


class UninformativeClassifier(Protocol):
    name: str

    def judge(self, preview: Preview) -> tuple[bool, str]: ...


class FlatColourHeuristic:
    """Uninformative when the 64x64 nearest-neighbour samples hold at most `max_colours` colours."""

    name = "flat"

    def __init__(self, max_colours: int = 32):
        self.max_colours = max_colours

    def judge(self, preview: Preview) -> tuple[bool, str]:
        colours = preview.nearest.getcolors(self.max_colours)  # None when there are more
        if colours is None:
            return False, ""
        return True, f"{len(colours)} colours in {preview.nearest.width}x{preview.nearest.height} samples (graphic or blank)"


class NoClassifier:
    """Keeps everything (`--uninformative none`)."""

    name = "none"

    def judge(self, preview: Preview) -> tuple[bool, str]:
        return False, ""


def load_classifier(spec: str, *, max_colours: int = 32) -> UninformativeClassifier:
    """`flat`, `none`, or `package.module:ClassName` (constructed without arguments)."""
    if spec == "flat":
        return FlatColourHeuristic(max_colours)
    if spec == "none":
        return NoClassifier()
    module, _, cls = spec.partition(":")
    if not module or not cls:
        raise ConfigError(f"uninformative: expected flat, none or module:Class, got {spec!r}")
    try:
        obj = getattr(importlib.import_module(module), cls)()
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"uninformative: cannot load {spec!r}: {exc}") from None
    if not callable(getattr(obj, "judge", None)):
        raise ConfigError(f"uninformative: {spec!r} has no judge(image) method")
    return obj
