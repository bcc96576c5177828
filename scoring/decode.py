"""Image decoding and resizing in worker processes, overlapped with the model.

`ImageDecoder` turns JPEG (or any Pillow) bytes into the model's input pixels using open_clip's
own eval transform up to (not including) ToTensor/Normalize, so the pixels are exactly what
open_clip's `preprocess` would feed; normalisation happens on the model's device. `decode_stream`
runs it in a process pool with a bounded window of batches in flight, so memory stays flat and
decoding runs while the model computes the previous batch.
"""

from __future__ import annotations

import io
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

MAX_PIXELS = 128_000_000  # decompression-bomb guard (stage 2 already checked; stay safe)


@dataclass
class DecodedBatch:
    """Pixels of the images that decoded, and (key, error) of those that did not."""

    keys: list[str]
    pixels: np.ndarray  # uint8 (N, H, W, 3)
    errors: list[tuple[str, str]] = field(default_factory=list)


class ImageDecoder:
    """Picklable: bytes -> uint8 HWC pixels of the model input size (open_clip eval transform)."""

    def __init__(self, preprocess_cfg: dict, fast_decode: bool = True):
        self.preprocess_cfg = dict(preprocess_cfg)
        self.fast_decode = fast_decode
        self._transform = None

    def _pil_transform(self):
        if self._transform is None:
            from open_clip.transform import PreprocessCfg, image_transform_v2
            from torchvision import transforms as T

            full = image_transform_v2(PreprocessCfg(**self.preprocess_cfg), is_train=False)
            steps = []
            for t in full.transforms:
                if isinstance(t, (T.ToTensor, T.Normalize)):
                    break
                steps.append(t)
            self._transform = T.Compose(steps)
        return self._transform

    def decode_one(self, data: bytes) -> np.ndarray:
        from PIL import Image

        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            if img.width * img.height > MAX_PIXELS:
                raise ValueError(f"image of {img.width}x{img.height} px exceeds the pixel limit")
            if self.fast_decode and img.format == "JPEG":
                size = self.preprocess_cfg["size"]
                h, w = (size, size) if isinstance(size, int) else size
                # Decode at the smallest 1/2^k scale still >= twice the input size, so the
                # final bicubic resize keeps its quality.
                img.draft("RGB", (2 * w, 2 * h))
            img.load()
        out = np.asarray(self._pil_transform()(img.convert("RGB")), dtype=np.uint8)
        if out.ndim != 3 or out.shape[2] != 3:
            raise ValueError(f"unexpected decoded shape {out.shape}")
        return out

    def __call__(self, items: list[tuple[str, bytes]]) -> DecodedBatch:
        keys, arrays, errors = [], [], []
        for key, data in items:
            try:
                arrays.append(self.decode_one(data))
                keys.append(key)
            except Exception as exc:  # one broken image must not stop the batch
                errors.append((key, f"{type(exc).__name__}: {exc}"[:500]))
        size = self.preprocess_cfg["size"]
        h, w = (size, size) if isinstance(size, int) else size
        pixels = np.stack(arrays) if arrays else np.zeros((0, h, w, 3), np.uint8)
        return DecodedBatch(keys, pixels, errors)


def _batches(items: Iterable[tuple[str, bytes]], size: int) -> Iterator[list[tuple[str, bytes]]]:
    batch: list[tuple[str, bytes]] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


DECODER_NICE = 10  # added to the decode workers' niceness (0: same priority as the model)


def _start_decoder() -> None:
    """A decode worker yields the cores to the model: decoding runs ahead of the model by a few
    batches, so it can wait; a model thread that loses its core stalls its whole matrix product."""
    import os

    from lait.memory import large_mmap_threshold

    large_mmap_threshold()
    if DECODER_NICE:
        try:
            os.nice(DECODER_NICE)
        except OSError:  # not permitted here: decode at the normal priority
            pass


def decode_stream(decoder: ImageDecoder, items: Iterable[tuple[str, bytes]], batch_size: int,
                  workers: int) -> Iterator[DecodedBatch]:
    """Decoded batches in input order; with `workers` > 0, decoded ahead in a process pool."""
    if workers <= 0:
        for batch in _batches(items, batch_size):
            yield decoder(batch)
        return
    import multiprocessing

    from lait import lifeline

    # fork: the children only run Pillow and numpy, never torch kernels.
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                               **lifeline.pool_kwargs(_start_decoder))
    window = 2 * workers + 1
    pending: deque = deque()
    try:
        for batch in _batches(items, batch_size):
            pending.append(pool.submit(decoder, batch))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for fut in pending:
            fut.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
