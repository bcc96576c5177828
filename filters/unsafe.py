"""Unsafe images: stage 2's `punsafe`, and the blur that keeps such pictures out of reports.

The probability comes from a catalogued model (`lait.models`, open_nsfw by default) and is kept
with every image, as LAION kept its `punsafe`: in `images_ok/`, then in each sample's JSON and
the shard sidecar. An image above `max_unsafe` is rejected as `filter/unsafe`.

DEFAULT_MAX_UNSAFE is 0.8: Yahoo's README for open_nsfw says scores above 0.8 are NSFW with
high probability, and on the 3,087 real benign photos of ../shared/data/photos it flags
well under 1 % (bench/safety/bench_unsafe.py prints the rate; docs/safety.md has it). A builder who
wants a stricter pool lowers it and reads the cost off that bench.
"""

from __future__ import annotations

import base64
import io

from PIL import Image, ImageFilter

DEFAULT_MAX_UNSAFE = 0.8
DEFAULT_MODEL = "open-nsfw"
MODEL_SIDE = 256  # open_nsfw resizes to 256 px, then crops 224: a larger decode buys nothing


def decode_for_model(data: bytes | memoryview, orientation: int = 1) -> Image.Image:
    """The upright RGB picture decoded at about MODEL_SIDE (JPEG: reduced-scale in libjpeg)."""
    from lait.imagehash import to_rgb, upright

    img = Image.open(io.BytesIO(data))
    if img.format in ("JPEG", "MPO"):
        img.draft("RGB", (MODEL_SIDE, MODEL_SIDE))
    img.load()
    return upright(to_rgb(img), orientation)


def check_unsafe_model(name: str) -> None:
    """`ModelUnavailable` naming the extra, and the way to run without the gate, when the
    model's package is missing. Never a silent pass: an unscored image is not a safe one."""
    from lait.models import ModelUnavailable, entry

    try:
        entry(name).check()
    except ModelUnavailable as exc:
        raise ModelUnavailable(f"{exc} (or --unsafe-model none: no punsafe, no filter/unsafe)") from None


class UnsafeScorer:
    """The catalogued model of `name`, loaded once per process (`lait.models` caches it)."""

    def __init__(self, name: str = DEFAULT_MODEL, max_unsafe: float = DEFAULT_MAX_UNSAFE):
        from lait.models import load_unsafe_classifier

        self.name, self.max_unsafe = name, max_unsafe
        self.model = load_unsafe_classifier(name)

    def __call__(self, image: Image.Image) -> float:
        """punsafe: the int8 model's, or the float model's near max_unsafe and above (lait.models)."""
        return float(self.model.punsafe([image], self.max_unsafe)[0])


def blurred(image: Image.Image) -> Image.Image:
    """So blurred that nothing but colours is left: a radius of a fifth of the longer side."""
    return image.filter(ImageFilter.GaussianBlur(radius=max(4, max(image.size) // 5)))


def needs_blur(punsafe: float | None, max_unsafe: float = DEFAULT_MAX_UNSAFE) -> bool:
    """Whether a report must blur a picture: unsafe, or never scored (unknown is not safe)."""
    return punsafe is None or punsafe < 0 or punsafe > max_unsafe


def report_punsafe(image: Image.Image) -> float | None:
    """punsafe of a picture a report is about to show, None when the model is not installed
    (the report then blurs it: it never shows what it could not check)."""
    from lait.models import ModelUnavailable

    try:
        return UnsafeScorer()(image)
    except ModelUnavailable:
        return None


def thumbnail_uri(image: Image.Image, side: int, punsafe: float | None = None, *,
                  max_unsafe: float = DEFAULT_MAX_UNSAFE) -> tuple[str, bool]:
    """(JPEG data URI of a `side` px thumbnail, blurred?). `punsafe` None or negative: scored
    here first. The blur is applied before the thumbnail is encoded, so no sharp copy leaves."""
    image = image.convert("RGB")
    if punsafe is None or punsafe < 0:
        punsafe = report_punsafe(image)
    blur = needs_blur(punsafe, max_unsafe)
    small = image.copy()
    small.thumbnail((side, side))
    if blur:
        small = blurred(small)
    buf = io.BytesIO()
    small.save(buf, "JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode(), blur

