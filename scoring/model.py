"""`ClipScorer`: an open_clip model loaded as the config asks, with batched text/image encoders.

Weights come from an open_clip pretrained tag, a local checkpoint, a `local-dir:`/`hf-hub:`
model folder, or the offline demo scorer (`model: demo`). `model: imagenet-concepts` is no
open_clip model: `lait.scoring.concepts` builds it from the packaged models of `lait.models`. When requested weights cannot be
loaded, `load_scorer` raises `WeightsUnavailable` (a `ConfigError`: the CLI prints it and exits
2) naming the cache directory and the `--checkpoint` alternative. A model without weights is
only built when the config sets `allow_random_init`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lait.config import ConfigError
from lait.scoring.config import ScoreConfig
from lait.scoring.pending import PendingImages

log = logging.getLogger(__name__)


class WeightsUnavailable(ConfigError):
    """The requested model weights could not be loaded (never replaced by random weights)."""


# The offline demo scorer (`--model demo`) is an open_clip `local-dir:` folder that the test kit
# trains on the built-in web's scenes (`lait.testkit.demo_scorer`); this stage only loads it.
DEMO_VERSION = "v2"  # v2: 360 steps instead of 450 (issue 52: the demo on a fresh HOME within 3 minutes)
DEMO_CONFIG = "open_clip_config.json"
DEMO_WEIGHTS = "open_clip_model.safetensors"
# The offline scorer built from the shipped ImageNet classifier and sentence encoder
# (lait.scoring.concepts; not a CLIP model, and not loaded through open_clip).
CONCEPTS = "imagenet-concepts"


def demo_scorer_dir(demo_dir: str | os.PathLike | None = None) -> Path:
    """Where the demo scorer lives: `demo_dir`, else `$LAIT_DEMO_MODEL_DIR`, else
    `$LAIT_CACHE/demo-scorer-v2` (`$LAIT_CACHE` defaulting to ~/.cache/lait)."""
    chosen = demo_dir or os.environ.get("LAIT_DEMO_MODEL_DIR")
    if chosen:
        return Path(chosen)
    from lait.storage import cache_root

    return cache_root() / f"demo-scorer-{DEMO_VERSION}"


def resolve_model(cfg: ScoreConfig) -> tuple[str, str | None, str]:
    """(open_clip model name, pretrained tag or file, label of the weights for `scored.pretrained`)."""
    if cfg.model == "demo":
        root = demo_scorer_dir(cfg.demo_dir)
        if not ((root / DEMO_CONFIG).is_file() and (root / DEMO_WEIGHTS).is_file()):
            raise WeightsUnavailable(
                f"the offline demo scorer is not built in {root}: `lait score --build-demo-model` "
                "(or `lait demo`) builds it once per machine")
        return f"local-dir:{root}", None, f"lait-demo-{DEMO_VERSION}"
    name = cfg.model
    if cfg.model_config:
        import open_clip

        path = Path(cfg.model_config)
        open_clip.add_model_config(path)
        if name == ScoreConfig.model or not name:
            name = path.stem
    if cfg.checkpoint:
        return name, cfg.checkpoint, f"file:{Path(cfg.checkpoint).name}"
    if cfg.pretrained:
        return name, cfg.pretrained, cfg.pretrained
    if name.startswith(("local-dir:", "hf-hub:")):
        return name, None, name.split(":", 1)[0]
    return name, None, ""


def _cache_hint(cfg: ScoreConfig) -> str:
    if cfg.cache_dir:
        return cfg.cache_dir
    hf = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub")
    return f"{hf} (Hugging Face hub) or ~/.cache/clip"


def pick_device(spec: str) -> str:
    """The torch device for this process: `auto` spreads pool workers over the visible GPUs."""
    import multiprocessing

    import torch

    if spec != "auto":
        return spec
    if not torch.cuda.is_available():
        return "cpu"
    n = torch.cuda.device_count()
    ident = multiprocessing.current_process()._identity
    return f"cuda:{(ident[0] - 1) % n if ident else 0}"


@contextlib.contextmanager
def _quiet_open_clip():
    # open_clip logs every loading step at INFO on the root logger.
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        root.setLevel(level)


@dataclass
class ClipScorer:
    """A loaded open_clip model with its preprocessing and tokenizer, ready to encode batches."""

    model: Any
    tokenizer: Any
    preprocess_cfg: dict
    name: str
    pretrained: str
    device: str
    autocast: bool

    @property
    def image_size(self) -> tuple[int, int]:
        size = self.preprocess_cfg["size"]
        return (size, size) if isinstance(size, int) else tuple(size)

    def _autocast(self):
        import torch

        if self.autocast:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def encode_texts(self, texts: list[str], batch_size: int = 256) -> np.ndarray:
        """L2-normalised fp32 embeddings of `texts`, in order."""
        import torch
        import torch.nn.functional as F

        out = []
        with torch.inference_mode(), self._autocast():
            for i in range(0, len(texts), batch_size):
                tokens = self.tokenizer(texts[i: i + batch_size]).to(self.device, non_blocking=True)
                out.append(F.normalize(self.model.encode_text(tokens).float(), dim=-1).cpu())
        if not out:
            return np.zeros((0, self.embed_dim), np.float32)
        return torch.cat(out).numpy()

    @property
    def embed_dim(self) -> int:
        proj = getattr(self.model, "text_projection", None)
        if proj is not None:
            return int(proj.shape[-1] if not hasattr(proj, "out_features") else proj.out_features)
        return int(self.model.visual.output_dim)

    def to_input(self, pixels):
        """uint8 pixels -> the normalised float batch on the device: host (N, H, W, 3) arrays
        (the CPU decoder's) are copied over from pinned memory; device (N, 3, H, W) tensors (the
        GPU decoder's) are used where they are."""
        import torch

        cuda = self.device.startswith("cuda")
        if isinstance(pixels, torch.Tensor):  # (N, 3, H, W), from the GPU decoder
            x = pixels.to(self.device, non_blocking=True)
        else:
            x = torch.from_numpy(np.ascontiguousarray(pixels))
            if cuda:
                x = x.pin_memory().to(self.device, non_blocking=True)
            x = x.permute(0, 3, 1, 2)
        mean, std = self._mean_std()
        x = x.float().div_(255.0).sub_(mean).div_(std)  # ToTensor, then Normalize, as open_clip
        if cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def _mean_std(self):
        import torch

        if getattr(self, "_norm", None) is None:
            self._norm = tuple(torch.tensor(self.preprocess_cfg[k], device=self.device).view(1, 3, 1, 1)
                               for k in ("mean", "std"))
        return self._norm

    def encode_images(self, pixels, *, tokens: bool = False):
        """L2-normalised fp32 image embeddings of uint8 pixels (see `to_input`); with `tokens`,
        also the patch tokens (N, grid_h * grid_w, width) of the visual tower."""
        return self.encode_images_async(pixels, tokens=tokens).result()

    def encode_images_async(self, pixels, *, tokens: bool = False) -> "PendingImages":
        """`encode_images` queued on the device: the result's copy to the host runs behind the
        model's work, so the caller can queue the next batch before it waits for this one."""
        import torch
        import torch.nn.functional as F

        x = self.to_input(pixels)
        visual = self.model.visual
        with torch.inference_mode(), self._autocast():
            if tokens:
                visual.output_tokens = True
                try:
                    pooled, toks = visual(x)
                finally:
                    visual.output_tokens = False
                return PendingImages.of(F.normalize(pooled.float(), dim=-1), toks.float())
            return PendingImages.of(F.normalize(self.model.encode_image(x).float(), dim=-1))

    @property
    def patch_grid(self) -> tuple[int, int]:
        grid = getattr(self.model.visual, "grid_size", None)
        if grid is None or not hasattr(self.model.visual, "output_tokens"):
            raise ConfigError(f"{self.name}: --regions needs a ViT visual tower (patch tokens)")
        return tuple(grid)


def load_scorer(cfg: ScoreConfig):
    """Build the model the config names, with its weights, on this process's device."""
    if cfg.model == CONCEPTS:
        from lait.scoring.concepts import load_concept_scorer

        return load_concept_scorer(pick_device(cfg.device))
    import open_clip
    import torch

    name, pretrained, label = resolve_model(cfg)
    device = pick_device(cfg.device)
    has_weights = bool(pretrained) or name.startswith(("local-dir:", "hf-hub:"))
    if not has_weights and not cfg.allow_random_init:
        raise WeightsUnavailable(
            f"no weights given for model {name!r}: pass --pretrained TAG (e.g. laion2b_s34b_b79k for ViT-B-32), "
            "--checkpoint PATH, or --model demo for the offline demo scorer; random weights only with "
            "allow_random_init: true (tests)")
    try:
        # Random weights (tests, benchmarks) are seeded, so every worker process builds the same model.
        with _quiet_open_clip(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            model = open_clip.create_model(
                name, pretrained=pretrained, device=device, cache_dir=cfg.cache_dir or None,
                require_pretrained=has_weights and not cfg.allow_random_init)
            tokenizer = open_clip.get_tokenizer(name, cache_dir=cfg.cache_dir or None)
    except Exception as exc:
        where = f"open_clip's cache ({_cache_hint(cfg)})"
        raise WeightsUnavailable(
            f"cannot load weights {pretrained or name!r} for model {name!r}: {str(exc).rstrip('.')}. They are looked up in "
            f"{where}; without internet, download them elsewhere and pass --checkpoint PATH "
            "(or --cache-dir DIR holding them)") from exc
    model.eval()
    if device.startswith("cuda"):
        model = model.to(memory_format=torch.channels_last)
    autocast = cfg.precision == "bf16" or (cfg.precision == "auto" and device.startswith("cuda"))
    pp = dict(model.visual.preprocess_cfg)
    log.info("score: model %s (%s) on %s%s", name, label or "random init", device, " bf16" if autocast else "")
    return ClipScorer(model, tokenizer, pp, name if cfg.model != "demo" else "demo", label or "random-init",
                      device, autocast)


_CACHE: dict[str, object] = {}


def get_scorer(cfg: ScoreConfig):
    """`load_scorer`, once per process and model settings (worker processes reuse it)."""
    key = repr((cfg.model, cfg.demo_dir, cfg.pretrained, cfg.checkpoint, cfg.model_config, cfg.cache_dir, cfg.device,
                cfg.precision, cfg.allow_random_init))
    if key not in _CACHE:
        _CACHE[key] = load_scorer(cfg)
    return _CACHE[key]


def runs_inline(cfg: ScoreConfig) -> bool:
    """Whether the partitions run in this process (one local worker)."""
    return cfg.executor == "local" and (cfg.workers or os.cpu_count() or 1) == 1


def preflight(cfg: ScoreConfig) -> None:
    """Load the model once here so that missing weights fail before any output exists."""
    if pick_device(cfg.device) == "cpu" or runs_inline(cfg):
        get_scorer(cfg)  # cached: the inline executor (and forked workers) reuse it
    else:
        # CUDA must not be initialised before the executor forks its workers.
        load_scorer(cfg.replace(device="cpu"))
