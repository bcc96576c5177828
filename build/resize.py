"""Images as they go into a shard: copied, or resized and re-encoded with img2dataset's options.

img2dataset's names and meanings (`resize_mode`, `image_size`, `resize_only_if_bigger`,
`encode_format`, `encode_quality`), so that one set of options means the same in both tools:

- `no`: the size is kept;
- `keep_ratio`: the smaller side becomes `image_size`;
- `center_crop`: as keep_ratio, then the centre `image_size` square is cut out;
- `border`: the larger side becomes `image_size`, then white borders make it square;
- `keep_ratio_largest`: the larger side becomes `image_size` (DataComp's download).

With `resize_only_if_bigger`, an image whose deciding side is not above `image_size` is not
resized (nor cropped or padded). Shrinking averages the source pixels each output pixel covers
(OpenCV's INTER_AREA, as img2dataset); enlarging uses OpenCV's Lanczos kernel over 8 taps
(INTER_LANCZOS4). Sizes round as img2dataset's (albumentations) do. A JPEG is decoded by OpenCV,
every other image by Pillow; JPEG and WebP are encoded by OpenCV, PNG by Pillow (the same bytes
as Pillow's JPEG and WebP, faster). An image already in `encode_format` and not resized is
copied byte for byte: the default (`no`, `jpg`) keeps every JPEG as fetched.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from lait.build.faces import DEFAULT_FACE_MODEL, DEFAULT_MIN_FACE_SCORE

RESIZE_MODES = ("no", "keep_ratio", "center_crop", "border", "keep_ratio_largest")
ENCODE_FORMATS = ("jpg", "png", "webp")
# Formats a fetched image may be in that are already `encode_format` (MPO is a JPEG with extras).
SAME_FORMAT = {"jpg": {"JPEG", "MPO"}, "png": {"PNG"}, "webp": {"WEBP"}}


@dataclass(frozen=True)
class ImageOptions:
    """How images are written into shards (picklable: it travels to the shard workers)."""

    resize_mode: str = "no"
    image_size: int = 256
    resize_only_if_bigger: bool = False
    encode_format: str = "jpg"
    encode_quality: int = 95
    blur_faces: bool = True  # blur the faces found (lait.faceblur) in the picture that ships
    face_model: str = DEFAULT_FACE_MODEL  # the detector that searches each shipped picture, or none
    min_face_score: float = DEFAULT_MIN_FACE_SCORE

    @property
    def geometry(self) -> str:
        """How the shipped picture is made from the stored one, as far as its pixels go (the
        format it is encoded in is not: faces are searched before encoding)."""
        if self.resize_mode == "no":
            return "stored"
        return f"{self.resize_mode}-{self.image_size}" + ("-if-bigger" if self.resize_only_if_bigger else "")

    def validate(self) -> None:
        if self.resize_mode not in RESIZE_MODES:
            raise ValueError(f"resize_mode must be one of {RESIZE_MODES}, got {self.resize_mode!r}")
        if self.encode_format not in ENCODE_FORMATS:
            raise ValueError(f"encode_format must be one of {ENCODE_FORMATS}, got {self.encode_format!r}")
        if self.image_size < 1:
            raise ValueError("image_size must be >= 1")
        if not 0 <= self.min_face_score <= 1:
            raise ValueError("min_face_score must be between 0 and 1")
        low, high = (0, 9) if self.encode_format == "png" else (1, 100)
        if not low <= self.encode_quality <= high:
            raise ValueError(f"encode_quality for {self.encode_format} must be between {low} and {high} "
                             f"(png: zlib compression level, as in img2dataset)")


@dataclass
class ShardImage:
    """An image ready for its shard: bytes (the fetched buffer itself when copied), tar
    extension, sizes before and after."""

    data: bytes | memoryview
    ext: str
    width: int
    height: int
    original_width: int
    original_height: int
    reencoded: bool
    faces: list[list[float]] | None = None  # normalised to the shipped picture; None: not searched
    face_scores: list[float] | None = None  # of a search made now (None when the boxes were known)
    searched: bool = False  # whether the faces were searched for in this call


# -- sizes -------------------------------------------------------------------------------------
def target_size(width: int, height: int, opts: ImageOptions) -> tuple[int, int] | None:
    """(width, height) the image is scaled to, before any crop or border; None: not resized."""
    mode, size = opts.resize_mode, opts.image_size
    if mode == "no":
        return None
    side = min(width, height) if mode in ("keep_ratio", "center_crop") else max(width, height)
    if opts.resize_only_if_bigger and side <= size:
        return None
    scale = size / side
    # Python's round, half to even: what albumentations' SmallestMaxSize/LongestMaxSize do.
    return max(1, round(width * scale)), max(1, round(height * scale))


# -- resampling --------------------------------------------------------------------------------
def resample(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """An H x W x C uint8 array resampled to height x width with OpenCV, as img2dataset does:
    area resampling when shrinking (each output pixel the mean of the source pixels it covers,
    INTER_AREA), Lanczos-4 when enlarging (INTER_LANCZOS4). The same library and the same
    interpolation give img2dataset's pixels, at img2dataset's speed (a numpy resampler of the
    same kernels was 6 times slower than OpenCV's and dominated the build with resizing)."""
    import cv2

    h, w = pixels.shape[:2]
    if (w, h) == (width, height):
        return pixels
    shrink = width <= w and height <= h
    return cv2.resize(np.ascontiguousarray(pixels), (width, height),
                      interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LANCZOS4)


def center_crop(pixels: np.ndarray, size: int) -> np.ndarray:
    h, w = pixels.shape[:2]
    top, left = (h - size) // 2, (w - size) // 2
    return pixels[max(top, 0):max(top, 0) + size, max(left, 0):max(left, 0) + size]


def add_border(pixels: np.ndarray, size: int) -> np.ndarray:
    """White borders around the image up to size x size, the image centred (odd pixel below/right)."""
    h, w = pixels.shape[:2]
    top, left = max(size - h, 0) // 2, max(size - w, 0) // 2
    out = np.full((max(size, h), max(size, w), pixels.shape[2]), 255, np.uint8)
    out[top:top + h, left:left + w] = pixels
    return out


# -- decoding and encoding ---------------------------------------------------------------------
def rgb_pixels(im) -> np.ndarray:
    """An RGB uint8 array of a Pillow image; transparency is laid on white, as browsers show it."""
    from PIL import Image

    if im.mode in ("RGBA", "LA", "P"):
        im = im.convert("RGBA")
        bg = Image.new("RGB", im.size, (255, 255, 255))
        bg.paste(im, mask=im.getchannel("A"))
        im = bg
    elif im.mode != "RGB":
        im = im.convert("RGB")
    return np.asarray(im, np.uint8)


def decode_pixels(data) -> tuple[np.ndarray, bool]:
    """(uint8 pixels, whether their channels are in OpenCV's B, G, R order) of image bytes. A
    colour or grey JPEG is decoded by OpenCV (libjpeg-turbo, as Pillow's: the same pixels,
    measured equal on the shared photos, and 40 % faster, the decoder img2dataset uses) and
    stays in OpenCV's order, which resampling, cropping and white borders do not mind; every
    other image, and a JPEG OpenCV declines, by Pillow, in RGB. The EXIF orientation is not
    applied, by either (Pillow does not; OpenCV is told not to)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:  # reads the header only
        if im.format in SAME_FORMAT["jpg"] and im.mode in ("RGB", "L"):
            import cv2

            bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
            if bgr is not None and bgr.shape[:2] == (im.height, im.width):
                return bgr, True
        im.load()
        return rgb_pixels(im), False


def _one_opencv_thread() -> None:
    """OpenCV on one thread in this process, as img2dataset's resizer sets it: the build's
    parallelism is its worker processes (one per core by default), and OpenCV's own pool in each
    of them would put cores x workers threads on the cores."""
    import cv2

    if cv2.getNumThreads() != 1:
        cv2.setNumThreads(1)


def _bgr_to_rgb(bgr: np.ndarray) -> np.ndarray:
    import cv2

    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


# Encoders whose bytes OpenCV gives the same as Pillow (libjpeg-turbo and libwebp with the same
# defaults: byte-identical at every quality tried, on the shared photos and in the tests) and
# faster, with no channel swap for pixels OpenCV decoded. PNG stays Pillow's: OpenCV's zlib
# settings give other bytes (the same pixels).
_CV_PARAMS = {"jpg": (".jpg", "IMWRITE_JPEG_QUALITY"), "webp": (".webp", "IMWRITE_WEBP_QUALITY")}


def encode(pixels: np.ndarray, opts: ImageOptions, bgr: bool = False) -> bytes:
    """The pixels (RGB, or OpenCV's B, G, R order with `bgr`) in `opts.encode_format`."""
    if opts.encode_format in _CV_PARAMS:
        import cv2

        ext, param = _CV_PARAMS[opts.encode_format]
        ok, buf = cv2.imencode(ext, pixels if bgr else cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR),
                               [getattr(cv2, param), opts.encode_quality])
        if not ok:
            raise ValueError(f"OpenCV could not encode a {pixels.shape[1]}x{pixels.shape[0]} image as {ext}")
        return buf.tobytes()
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(_bgr_to_rgb(pixels) if bgr else pixels, "RGB").save(
        buf, "PNG", compress_level=opts.encode_quality)
    return buf.getvalue()


def transform(pixels: np.ndarray, opts: ImageOptions) -> np.ndarray | None:
    """The pixels resized (cropped, bordered) as `opts` say; None when the image is not resized."""
    h, w = pixels.shape[:2]
    size = target_size(w, h, opts)
    if size is None:
        return None
    out = resample(pixels, *size)
    if opts.resize_mode == "center_crop":
        out = center_crop(out, opts.image_size)
    elif opts.resize_mode == "border":
        out = add_border(out, opts.image_size)
    return out


def read_back(rgb: np.ndarray, opts: ImageOptions) -> np.ndarray:
    """RGB pixels as a shard's reader gets them back: encoded as `opts` say, then decoded."""
    import cv2

    bgr = cv2.imdecode(np.frombuffer(encode(rgb, opts), np.uint8), cv2.IMREAD_COLOR)
    return _bgr_to_rgb(bgr)


def stored_format(data, fmt: str) -> str:
    """The format of the bytes stage 2 stored: JPEG when they are one (the kept JPEG, or the
    re-encode of a PNG, WebP, CMYK JPEG ...: images_ok's `format` is the fetched file's), else
    `fmt`, what stage 2 recorded (images_ok written by other tools)."""
    return "JPEG" if bytes(data[:3]) == b"\xff\xd8\xff" else fmt


def prepare(data: bytes, fmt: str, width: int, height: int, opts: ImageOptions,
            faces: list[list[float]] | None = None, search: Any = None) -> ShardImage:
    """The shard's copy of an image (`fmt`, `width`, `height` as stage 2 found them): the bytes as
    stored when nothing changes, else decoded, resized, faces blurred and encoded; raises on
    undecodable bytes.

    The faces are those of the picture that ships: `faces` (normalised boxes, known from an
    earlier search with the same key), or, with `search` (a `build.faces.FaceFinder`), found
    now on the shipped picture, resized as it ships and at most `FACE_SIDE` on its long side
    (an image shipped as stored is searched at a reduced-scale decode, and decoded whole only
    when a face is to be blurred). With `opts.blur_faces` they are blurred. The boxes and
    scores used are the result's `faces` and `face_scores`; `searched` says whether `search`
    ran."""
    same = opts.resize_mode == "no" and fmt.upper() in SAME_FORMAT[opts.encode_format]
    scores: list[float] | None = None
    searched = False
    ship = None if opts.encode_format == "png" else (lambda rgb: read_back(rgb, opts))
    seen = None
    if same and faces is None and search is not None:
        from lait.build.faces import decode_for_search

        seen = decode_for_search(data)
        faces, scores = search(seen, ship)
        searched = True
    if same and not (faces and opts.blur_faces):
        return ShardImage(data, opts.encode_format, width, height, width, height, False, faces, scores, searched)
    _one_opencv_thread()
    if seen is not None and seen.size == (width, height) and fmt.upper() in SAME_FORMAT["jpg"]:
        # A JPEG searched at its full size (Pillow's libjpeg-turbo gives OpenCV's pixels): not decoded twice.
        pixels, bgr = np.asarray(seen, np.uint8), False
    else:
        pixels, bgr = decode_pixels(data)
    original_height, original_width = pixels.shape[:2]
    resized = transform(pixels, opts)
    out = pixels if resized is None else resized
    if faces is None and search is not None:
        from lait.build.faces import search_picture

        faces, scores = search(search_picture(_bgr_to_rgb(out) if bgr else out), ship)
        searched = True
    if faces and opts.blur_faces:
        from lait.faceblur import blur_faces

        out, _ = blur_faces(_bgr_to_rgb(out) if bgr else out, faces)
        bgr = False
    return ShardImage(encode(out, opts, bgr), opts.encode_format, out.shape[1], out.shape[0],
                      original_width, original_height, True, faces, scores, searched)


# -- EXIF --------------------------------------------------------------------------------------
_IFDS = (("Image", None), ("EXIF", 0x8769), ("GPS", 0x8825), ("Interoperability", 0xA005))


def jpeg_has_exif(data) -> bool:
    """Whether a JPEG has an EXIF segment: a walk over the segments before the image data, so
    that the JPEGs without one (most) are never opened."""
    view = memoryview(data)
    pos = 2
    while pos + 4 <= len(view) and view[pos] == 0xFF:
        marker = view[pos + 1]
        if marker == 0xDA or marker == 0xD9:  # start of scan, end of image: no more headers
            return False
        length = (view[pos + 2] << 8) | view[pos + 3]
        if marker == 0xE1 and bytes(view[pos + 4:pos + 10]) == b"Exif\x00\x00":
            return True
        pos += 2 + length
    return False


def exif_json(data, fmt: str = "JPEG") -> str:
    """The EXIF tags of the image bytes as a JSON object of strings (img2dataset's `exif` form,
    `"IFD TagName": "value"`); "{}" when there are none or they cannot be read."""
    if fmt.upper() in SAME_FORMAT["jpg"] and not jpeg_has_exif(data):
        return "{}"
    try:
        from PIL import ExifTags, Image

        with Image.open(io.BytesIO(data)) as im:
            exif = im.getexif()
            tags: dict[str, str] = {}
            for ifd_name, ifd_id in _IFDS:
                entries = exif if ifd_id is None else exif.get_ifd(ifd_id)
                names = ExifTags.GPSTAGS if ifd_name == "GPS" else ExifTags.TAGS
                for tag, value in entries.items():
                    if ifd_id is None and tag in (0x8769, 0x8825, 0xA005):
                        continue  # pointers to the sub-IFDs read above
                    if isinstance(value, bytes):
                        if len(value) > 256:
                            continue  # maker notes and thumbnails: binary, not tags
                        value = value.decode("latin-1")
                    text = str(value).strip().replace("\x00", "")
                    tags[f"{ifd_name} {names.get(tag, hex(tag))}"] = text
        return json.dumps(tags, ensure_ascii=False, sort_keys=True)
    except Exception:  # a broken EXIF block is not a broken image
        return "{}"
