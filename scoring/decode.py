"""Image decoding and resizing for stage 4, overlapped with the model.

Two decoders make the model's input pixels from an image's bytes:

- `ImageDecoder` (CPU, picklable, run in worker processes). With `fast_decode` a JPEG is decoded
  by OpenCV (at a 1/2, 1/4 or 1/8 DCT scale when that is still twice the model's input), then
  resized with the eval transform's antialiased filter and centre-cropped where it places it
  (embeddings within 1e-4 of open_clip's on the shared photos); every other image,
  and every image without `fast_decode`, goes through open_clip's own eval transform up to (not
  including) ToTensor/Normalize, so its pixels are exactly what open_clip's `preprocess` feeds.
- `DeviceJpegDecoder` (CUDA): torchvision's nvJPEG decode of a list of JPEGs (the GPU's hardware
  decoder where it has one), antialiased resize and crop on the GPU, so neither the full-size
  pixels nor the resized ones cross the PCIe bus. What it cannot decode falls back to the CPU
  decoder, image by image.

`decode_stream` runs the CPU decoder in a process pool; `hybrid_stream` feeds the GPU decoder and
the pool side by side from one dispatcher thread, giving each free lane the next chunk. Both cut
the images into chunks much smaller than a model batch (so every worker is busy however large
the batch), keep a bounded window in flight (memory stays flat), and yield model batches in
input order. Normalisation happens on the model's device (`ClipScorer.to_input`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

MAX_PIXELS = 128_000_000  # decompression-bomb guard (stage 2 already checked; stay safe)
CHUNK = 32  # images per decode task: many per model batch, so that every worker has work
DECODER_NICE = 10  # added to the decode workers' niceness (0: same priority as the model)


@dataclass
class DecodedBatch:
    """Pixels of the images that decoded, and (key, error) of those that did not.

    `pixels`: uint8 (N, H, W, 3) on the host (the CPU decoder), or a uint8 (N, 3, H, W) torch
    tensor on the model's device (the GPU decoder, and batches that mix both lanes)."""

    keys: list[str]
    pixels: Any
    errors: list[tuple[str, str]] = field(default_factory=list)
    ready: Any = None  # device pixels: the CUDA event after which they are written

    def wait(self) -> None:
        """Make this thread's current CUDA stream wait for device pixels written on another
        stream, and keep their memory from reuse until that stream is done with them."""
        if self.ready is None:
            return
        import torch

        current = torch.cuda.current_stream(self.pixels.device)
        current.wait_event(self.ready)
        self.pixels.record_stream(current)
        self.ready = None


def is_jpeg(data: bytes) -> bool:
    return data[:3] == b"\xff\xd8\xff"


# SOF markers that carry the frame size (not DHT C4, JPG C8 or DAC CC).
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's frame header, without decoding; None when none is found."""
    i, n = 2, len(data)
    while i + 9 < n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if 0xD0 <= marker <= 0xD9 or marker == 0x01:  # markers without a length
            i += 2
            continue
        length = (data[i + 2] << 8) | data[i + 3]
        if marker in _SOF:
            h = (data[i + 5] << 8) | data[i + 6]
            w = (data[i + 7] << 8) | data[i + 8]
            return (w, h) if w and h else None
        if marker == 0xDA:  # start of scan before any frame header
            return None
        i += 2 + length
    return None


@dataclass(frozen=True)
class Geometry:
    """Where open_clip's eval transform puts an image of a given size: the resized size and the
    crop box. `fast` is False for transforms the fast paths do not reproduce (they then use
    open_clip's own)."""

    height: int
    width: int
    mode: str  # shortest | squash
    fast: bool
    upscale_cubic: bool

    @classmethod
    def of(cls, preprocess_cfg: dict) -> "Geometry":
        size = preprocess_cfg["size"]
        h, w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        mode = preprocess_cfg.get("resize_mode", "shortest")
        interp = preprocess_cfg.get("interpolation", "bicubic")
        fast = (mode == "squash" or (mode == "shortest" and h == w)) and interp in ("bicubic", "bilinear")
        return cls(h, w, mode, fast, interp == "bicubic")

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after the resize step, as torchvision's Resize computes it."""
        if self.mode == "squash":
            return self.width, self.height
        short, long_ = (width, height) if width <= height else (height, width)
        new_long = int(self.height * long_ / short)
        return (self.height, new_long) if width <= height else (new_long, self.height)

    def shrinks(self, width: int, height: int) -> bool:
        """Whether the resize makes an image of this size smaller (or keeps it) on both axes."""
        rw, rh = self.resized(width, height)
        return rw <= width and rh <= height

    def crop(self, width: int, height: int) -> tuple[int, int]:
        """(left, top) of the centre crop of a resized (width, height) image, as CenterCrop."""
        return int(round((width - self.width) / 2.0)), int(round((height - self.height) / 2.0))

    def reduction(self, width: int, height: int) -> int:
        """The largest JPEG DCT scale 1/k (k in 8, 4, 2, 1) whose image is still at least twice
        the resize target, so that the final antialiased resize keeps its quality (a DCT scale
        alone blurs more than the bicubic filter would)."""
        rw, rh = self.resized(width, height)
        for k in (8, 4, 2):
            if -(-width // k) >= 2 * rw and -(-height // k) >= 2 * rh:
                return k
        return 1


_REDUCED = {1: "IMREAD_COLOR", 2: "IMREAD_REDUCED_COLOR_2", 4: "IMREAD_REDUCED_COLOR_4", 8: "IMREAD_REDUCED_COLOR_8"}


class ImageDecoder:
    """Picklable: bytes -> uint8 HWC pixels of the model input size (see the module doc)."""

    def __init__(self, preprocess_cfg: dict, fast_decode: bool = True):
        self.preprocess_cfg = dict(preprocess_cfg)
        self.fast_decode = fast_decode
        self.geometry = Geometry.of(self.preprocess_cfg)
        self._transform = None

    def __getstate__(self):
        return {"preprocess_cfg": self.preprocess_cfg, "fast_decode": self.fast_decode, "geometry": self.geometry,
                "_transform": None}

    def _pil_transform(self):
        if self._transform is None:
            from open_clip.transform import PreprocessCfg, image_transform_v2
            from torchvision import transforms as T

            full = image_transform_v2(PreprocessCfg(**self.preprocess_cfg), is_train=False)
            steps = []
            for t in full.transforms:
                if isinstance(t, (T.ToTensor, T.Normalize)) or type(t).__name__ == "MaybeToTensor":
                    break
                steps.append(t)
            self._transform = T.Compose(steps)
        return self._transform

    def decode_one(self, data: bytes) -> np.ndarray:
        if self.fast_decode and self.geometry.fast and is_jpeg(data):
            size = jpeg_size(data)
            if size is not None:
                if size[0] * size[1] > MAX_PIXELS:
                    raise ValueError(f"image of {size[0]}x{size[1]} px exceeds the pixel limit")
                out = self._fast_jpeg(data, size)
                if out is not None:
                    return out
        return self._decode_pil(data)

    def _fast_jpeg(self, data: bytes, size: tuple[int, int]) -> np.ndarray | None:
        """OpenCV's (scaled) JPEG decode, then the eval transform's antialiased resize (torch's
        uint8 kernel, the same filter as Pillow's) and centre crop; None when OpenCV cannot read
        it (Pillow then tries)."""
        import cv2
        import torch
        import torch.nn.functional as F

        g = self.geometry
        # BGR, as libjpeg-turbo gives it: OpenCV's own RGB mode costs a conversion more.
        flags = getattr(cv2, _REDUCED[g.reduction(*size)]) | cv2.IMREAD_IGNORE_ORIENTATION  # as Pillow and nvJPEG
        bgr = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
        if bgr is None or bgr.ndim != 3 or bgr.shape[2] != 3:
            return None
        h, w = bgr.shape[:2]
        # The target comes from the full size, as the eval transform sees the image.
        rw, rh = g.resized(*size)
        left, top = g.crop(rw, rh)
        if left < 0 or top < 0 or left + g.width > rw or top + g.height > rh:
            return None
        rows, cols = slice(top, top + g.height), slice(left, left + g.width)
        if (rw, rh) == (w, h):
            return cv2.cvtColor(np.ascontiguousarray(bgr[rows, cols]), cv2.COLOR_BGR2RGB)
        x = torch.from_numpy(bgr).permute(2, 0, 1)[None]  # channels-last uint8: the fast kernel
        mode = "bicubic" if g.upscale_cubic else "bilinear"
        planes = F.interpolate(x, size=(rh, rw), mode=mode, antialias=True, align_corners=False)[0].numpy()
        # The planes, cropped, interleaved as R, G, B in one pass.
        return cv2.merge([planes[2, rows, cols], planes[1, rows, cols], planes[0, rows, cols]])

    def _decode_pil(self, data: bytes) -> np.ndarray:
        from PIL import Image

        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            if img.width * img.height > MAX_PIXELS:
                raise ValueError(f"image of {img.width}x{img.height} px exceeds the pixel limit")
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
        g = self.geometry
        pixels = np.stack(arrays) if arrays else np.zeros((0, g.height, g.width, 3), np.uint8)
        return DecodedBatch(keys, pixels, errors)


class DeviceJpegDecoder:
    """JPEGs decoded by nvJPEG on the device (torchvision's `decode_jpeg`) and resized and cropped
    there, as `ImageDecoder`'s geometry says; the rest of a chunk, and any JPEG the device
    refuses, goes through `fallback` (the CPU decoder) and is uploaded. Not picklable: it runs
    on a thread of the model's process, on its own CUDA stream."""

    MAX_CHUNK_PIXELS = 256_000_000  # decoded at full size: bound the device memory of one call

    def __init__(self, fallback: ImageDecoder, device: str):
        import torch

        self.fallback = fallback
        self.geometry = fallback.geometry
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def __call__(self, items: list[tuple[str, bytes]]) -> DecodedBatch:
        import contextlib

        import torch

        g = self.geometry
        slots: list[int] = []  # out rows filled, in input order
        keys: list[str] = []
        errors: list[tuple[str, str]] = []
        device_jobs: list[tuple[int, bytes]] = []
        host: list[int] = []
        for i, (_, data) in enumerate(items):
            size = jpeg_size(data) if is_jpeg(data) else None
            # An image smaller than the model's input is enlarged on the host: the device's float
            # bicubic upsampling is not Pillow's (and such images are few and cheap).
            if size is not None and size[0] * size[1] <= MAX_PIXELS and g.shrinks(*size):
                device_jobs.append((i, data))
            else:
                host.append(i)
        ctx = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        done: dict[int, bool] = {}
        with ctx:
            out = torch.empty((len(items), 3, g.height, g.width), dtype=torch.uint8, device=self.device)
            for group in self._groups(device_jobs):
                for i, ok in self._decode_group(group, out).items():
                    done[i] = ok
            for i in host + [i for i, ok in done.items() if not ok]:
                key, data = items[i]
                try:
                    px = torch.from_numpy(np.require(self.fallback.decode_one(data), requirements="W")).permute(2, 0, 1)
                    out[i].copy_(px.pin_memory() if self.device.type == "cuda" else px, non_blocking=True)
                    done[i] = True
                except Exception as exc:  # one broken image must not stop the chunk
                    errors.append((key, f"{type(exc).__name__}: {exc}"[:500]))
            for i in range(len(items)):
                if done.get(i):
                    slots.append(i)
                    keys.append(items[i][0])
            pixels = out if len(slots) == len(items) else out[torch.tensor(slots, dtype=torch.long, device=self.device)]
            event = None
            if self.stream is not None:
                event = torch.cuda.Event()
                event.record(self.stream)
        # The consumer's stream waits for `event` when it takes the pixels (`DecodedBatch.wait`).
        return DecodedBatch(keys, pixels, errors, event)

    def _groups(self, jobs: list[tuple[int, bytes]]) -> Iterator[list[tuple[int, bytes]]]:
        group: list[tuple[int, bytes]] = []
        pixels = 0
        for i, data in jobs:
            w, h = jpeg_size(data) or (0, 0)
            if group and pixels + w * h > self.MAX_CHUNK_PIXELS:
                yield group
                group, pixels = [], 0
            group.append((i, data))
            pixels += w * h
        if group:
            yield group

    def _decode_group(self, group: list[tuple[int, bytes]], out) -> dict[int, bool]:
        """Decode a list of JPEGs on the device into `out`'s rows; {row: decoded}."""
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg

        with warnings.catch_warnings():
            # The bytes are read-only (nvJPEG only reads them); torchvision 0.29 also announces
            # that its decoders move to TorchCodec, which the GPU images do not have yet.
            warnings.simplefilter("ignore")
            encoded = [torch.frombuffer(data, dtype=torch.uint8) for _, data in group]
            try:
                images = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device)
            except RuntimeError:
                # One bad image fails the whole call: decode one by one, and leave what fails
                # here to the CPU decoder.
                images = []
                for e in encoded:
                    try:
                        images.append(decode_jpeg(e, mode=ImageReadMode.RGB, device=self.device))
                    except RuntimeError:
                        images.append(None)
        result: dict[int, bool] = {}
        by_shape: dict[tuple[int, int], list[tuple[int, Any]]] = {}
        for (i, _), img in zip(group, images):
            if img is None or img.ndim != 3 or img.shape[0] != 3:
                result[i] = False
                continue
            by_shape.setdefault((img.shape[1], img.shape[2]), []).append((i, img))
        for (h, w), members in by_shape.items():
            self._resize_into(torch.stack([img for _, img in members]), [i for i, _ in members], w, h, out)
            for i, _ in members:
                result[i] = True
        return result

    def _resize_into(self, x, rows: list[int], width: int, height: int, out) -> None:
        """Resize a stack of same-size decoded images as the eval transform does, crop, write."""
        import torch
        import torch.nn.functional as F

        g = self.geometry
        rw, rh = g.resized(width, height)
        if (rw, rh) != (width, height):
            mode = "bicubic" if g.upscale_cubic else "bilinear"
            x = F.interpolate(x.float(), size=(rh, rw), mode=mode, antialias=True, align_corners=False)
            x = x.round_().clamp_(0, 255).to(torch.uint8)
        left, top = g.crop(rw, rh)
        x = x[:, :, top: top + g.height, left: left + g.width]
        idx = torch.tensor(rows, dtype=torch.long, device=x.device)
        out.index_copy_(0, idx, x.contiguous())


def _sendable(chunk: list[tuple[str, Any]]) -> list[tuple[str, bytes]]:
    """A chunk as it can be pickled to a worker process: memoryviews (rows read as views) copied."""
    return [(k, d if isinstance(d, bytes) else bytes(d)) for k, d in chunk]


def _chunks(items: Iterable[tuple[str, bytes]], size: int) -> Iterator[list[tuple[str, bytes]]]:
    chunk: list[tuple[str, bytes]] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _start_decoder() -> None:
    """A decode worker yields the cores to the model: decoding runs ahead of the model by a few
    batches, so it can wait; a model thread that loses its core stalls its whole matrix product.
    OpenCV and torch run on one thread: the pool's processes are the parallelism."""
    from lait.memory import large_mmap_threshold

    large_mmap_threshold()
    import cv2
    import torch

    cv2.setNumThreads(1)
    # One thread: the resize then never enters an OpenMP region, which a forked child of a
    # process that used one must not.
    torch.set_num_threads(1)
    if DECODER_NICE:
        try:
            os.nice(DECODER_NICE)
        except OSError:  # not permitted here: decode at the normal priority
            pass


def _ready() -> bool:
    return True


def decoder_pool(workers: int) -> ProcessPoolExecutor:
    """A process pool of `workers` decode workers, all started now: forked before this process
    starts any helper thread of its own (a fork copies only the forking thread)."""
    import multiprocessing

    from lait import lifeline

    # fork: the children run OpenCV, Pillow and torch's uint8 resize on one thread, never CUDA.
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                               **lifeline.pool_kwargs(_start_decoder))
    for fut in [pool.submit(_ready) for _ in range(workers)]:
        fut.result()
    return pool


_POOLS: dict[int, ProcessPoolExecutor] = {}
_KEEP = [False]


def shared_pool(workers: int) -> ProcessPoolExecutor:
    """This process's decode pool of `workers` processes: started once and reused by every
    partition inside `keeping_pools()`, else ended by `release_pools` after each partition."""
    pool = _POOLS.get(workers)
    if pool is None:
        close_pools()
        pool = _POOLS[workers] = decoder_pool(workers)
    return pool


def close_pools() -> None:
    while _POOLS:
        _, pool = _POOLS.popitem()
        pool.shutdown(wait=True, cancel_futures=True)


def release_pools() -> None:
    """End of a partition: the pool goes, unless this process keeps it for the next one. (A
    pool left behind in an executor's worker process would keep that process from exiting.)"""
    if not _KEEP[0]:
        close_pools()


@contextlib.contextmanager
def keeping_pools() -> Iterator[None]:
    """The partitions run inside this block in this process share one decode pool, ended at its close."""
    _KEEP[0] = True
    try:
        yield
    finally:
        _KEEP[0] = False
        close_pools()


class _Batcher:
    """Decoded chunks in, model batches of `batch_size` out, in input order."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.keys: list[str] = []
        self.parts: list[Any] = []
        self.errors: list[tuple[str, str]] = []

    def add(self, chunk: DecodedBatch) -> Iterator[DecodedBatch]:
        chunk.wait()
        self.errors.extend(chunk.errors)
        start = 0
        n = len(chunk.keys)
        while start < n:
            take = min(n - start, self.batch_size - len(self.keys))
            self.keys.extend(chunk.keys[start: start + take])
            self.parts.append(chunk.pixels[start: start + take])
            start += take
            if len(self.keys) == self.batch_size:
                yield self._emit()

    def finish(self) -> Iterator[DecodedBatch]:
        if self.keys or self.errors:
            yield self._emit()

    def _emit(self) -> DecodedBatch:
        parts = self.parts
        if not parts:
            pixels = None
        elif len(parts) == 1:
            pixels = parts[0]
        elif isinstance(parts[0], np.ndarray) and all(isinstance(p, np.ndarray) for p in parts):
            pixels = np.concatenate(parts)
        else:
            pixels = _concat_on_device(parts)
        batch = DecodedBatch(self.keys, pixels, self.errors)
        self.keys, self.parts, self.errors = [], [], []
        return batch


def _concat_on_device(parts: list[Any]):
    """Host (N,H,W,3) and device (N,3,H,W) uint8 parts -> one device (N,3,H,W) tensor."""
    import torch

    device = next(p.device for p in parts if isinstance(p, torch.Tensor))
    moved = []
    for p in parts:
        if isinstance(p, np.ndarray):
            t = torch.from_numpy(p)
            if device.type == "cuda":
                t = t.pin_memory()
            p = t.to(device, non_blocking=True).permute(0, 3, 1, 2)
        moved.append(p)
    return torch.cat(moved)


def decode_stream(decoder: ImageDecoder, items: Iterable[tuple[str, bytes]], batch_size: int,
                  workers: int, pool: ProcessPoolExecutor | None = None, chunk: int = CHUNK) -> Iterator[DecodedBatch]:
    """Decoded batches in input order; with `workers` > 0, decoded ahead in a process pool (or in
    `pool`, when given: the caller's, reused across calls) in chunks of `chunk` images."""
    if workers <= 0 and pool is None:
        batcher = _Batcher(batch_size)
        for part in _chunks(items, batch_size):
            yield from batcher.add(decoder(part))
        yield from batcher.finish()
        return
    own = pool is None
    if own:
        pool = decoder_pool(workers)
    window = 4 * (workers or pool._max_workers) + 1
    pending: deque = deque()
    batcher = _Batcher(batch_size)
    try:
        for part in _chunks(items, min(chunk, batch_size)):
            pending.append(pool.submit(decoder, _sendable(part)))
            if len(pending) >= window:
                yield from batcher.add(pending.popleft().result())
        while pending:
            yield from batcher.add(pending.popleft().result())
        yield from batcher.finish()
    finally:
        for fut in pending:
            fut.cancel()
        if own:
            pool.shutdown(wait=True, cancel_futures=True)


class hybrid_stream:
    """Decoded batches in input order from two lanes at once: the device decoder on a thread of
    this process and the CPU decoder in `pool`. A dispatcher thread hands the next chunk to
    whichever lane has room (the device lane first), so the faster lane takes more; a chunk
    with no JPEG goes to the pool. Batches are device tensors (N, 3, H, W).

    Which lane decodes an image changes its pixels slightly (different resize filters), so on
    CUDA the scores are reproducible to the stated tolerance, not bit for bit (docs/performance.md)."""

    def __init__(self, device_decoder: DeviceJpegDecoder, cpu_decoder: ImageDecoder,
                 items: Iterable[tuple[str, bytes]], batch_size: int, pool: ProcessPoolExecutor | None,
                 chunk: int = CHUNK, device_window: int = 3, ahead: int | None = None):
        from concurrent.futures import ThreadPoolExecutor

        self.device_decoder, self.cpu_decoder = device_decoder, cpu_decoder
        self.items, self.batch_size, self.pool, self.chunk = items, batch_size, pool, min(chunk, batch_size)
        self.cpu_window = 2 * pool._max_workers if pool is not None else 0
        self.device_window = device_window
        self.ahead = ahead or (self.cpu_window + device_window + 2 * max(1, batch_size // self.chunk))
        self.lane = ThreadPoolExecutor(1, thread_name_prefix="lait-device-decode")
        self.cond = threading.Condition()
        self.futures: dict[int, Future] = {}
        self.inflight = {"device": 0, "cpu": 0}
        self.consumed = 0
        self.total: int | None = None
        self.stop = False
        self.error: BaseException | None = None
        self.lanes = {"device": 0, "cpu": 0}  # chunks each lane took (for the logs and benches)
        self.thread = threading.Thread(target=self._dispatch, name="lait-decode-dispatch", daemon=True)

    def _done(self, lane: str):
        def callback(_fut):
            with self.cond:
                self.inflight[lane] -= 1
                self.cond.notify_all()
        return callback

    def _lane_for(self, has_jpeg: bool, n: int) -> str | None:
        """The lane for chunk `n`, or None while every lane is full or the window is."""
        if n - self.consumed >= self.ahead:
            return None
        device_room = self.inflight["device"] < self.device_window
        if has_jpeg and device_room:
            return "device"
        if self.pool is not None:
            return "cpu" if self.inflight["cpu"] < self.cpu_window else None
        return "device" if device_room else None  # no pool: the device lane's fallback decodes it

    def _dispatch(self) -> None:
        try:
            n = 0
            for part in _chunks(self.items, self.chunk):
                has_jpeg = any(is_jpeg(d) for _, d in part)
                with self.cond:
                    lane = None
                    while not self.stop and (lane := self._lane_for(has_jpeg, n)) is None:
                        self.cond.wait()
                    if self.stop:
                        return
                    self.inflight[lane] += 1
                    self.lanes[lane] += 1
                fut = (self.lane.submit(self.device_decoder, part) if lane == "device"
                       else self.pool.submit(self.cpu_decoder, _sendable(part)))
                fut.add_done_callback(self._done(lane))
                with self.cond:
                    self.futures[n] = fut
                    self.cond.notify_all()
                n += 1
            with self.cond:
                self.total = n
                self.cond.notify_all()
        except BaseException as exc:  # the consumer re-raises it
            with self.cond:
                self.error = exc
                self.cond.notify_all()

    def __iter__(self) -> Iterator[DecodedBatch]:
        self.thread.start()
        batcher = _Batcher(self.batch_size)
        try:
            while True:
                with self.cond:
                    while self.consumed not in self.futures and self.error is None and (
                            self.total is None or self.consumed < self.total):
                        self.cond.wait()
                    if self.error is not None:
                        raise self.error
                    if self.total is not None and self.consumed >= self.total:
                        break
                    fut = self.futures.pop(self.consumed)
                chunk = fut.result()
                with self.cond:
                    self.consumed += 1
                    self.cond.notify_all()
                yield from batcher.add(chunk)
            yield from batcher.finish()
        finally:
            with self.cond:
                self.stop = True
                self.cond.notify_all()
            for fut in self.futures.values():
                fut.cancel()
            self.thread.join()
            self.lane.shutdown(wait=True, cancel_futures=True)
