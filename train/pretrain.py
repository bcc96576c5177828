"""``lait train pretrain``: ImageBERT multi-stage pretraining on lait shards.

Each stage (e.g. the paper's large out-of-domain web data, then in-domain data) has its own
shards, steps, batch size, optimiser settings and task weights, and starts from the weights the
previous stage ended with.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from lait.config import ConfigError
from lait.train.batch import Batch
from lait.train.config import DataConfig, PretrainConfig, RegionConfig, TaskWeights, TrainStageConfig
from lait.train.data import (
    Decoder,
    ShardStream,
    check_enough_shards,
    count_samples,
    default_tokenizer,
    expand_shards,
    first_sample_keys,
    make_loader,
)
from lait.train.loop import StagePlan, Trainer
from lait.train.model import ImageBert, ImageBertConfig
from lait.train.regions import PatchPooling, add_tags, build_online_regions, fill_regions
from lait.train.runtime import Runtime, start_training

log = logging.getLogger(__name__)


@dataclass
class RegionSetup:
    """What the region source implies: worker-side patch pooling or an on-device frozen model."""

    patches: PatchPooling | None
    online: torch.nn.Module | None
    feature_dim: int | None  # None: whatever the shards hold (checked on the first batch)
    num_classes: int | None
    tags: torch.nn.Module | None = None  # regions.tags: the object tagger (`with_tags`)


def region_setup(cfg: RegionConfig, device: torch.device) -> RegionSetup:
    if cfg.source == "patches":
        p = PatchPooling(cfg.patch_grid[0], cfg.patch_grid[1], cfg.patch_pixels)
        if p.rows * p.cols > cfg.max_regions:
            raise ConfigError(f"data.regions.patch_grid {cfg.patch_grid} gives more cells than "
                              f"data.regions.max_regions={cfg.max_regions}")
        return RegionSetup(p, None, p.feature_dim, None)
    try:
        online = build_online_regions(cfg)
    except ValueError as exc:  # a required weight or setting of the region model is missing
        raise ConfigError(f"data.regions: {exc}") from None
    if online is None:
        return RegionSetup(None, None, None, None)
    return RegionSetup(None, online.to(device), online.feature_dim, online.num_classes or None)


def with_tags(setup: RegionSetup, cfg: RegionConfig, tokenizer, device: torch.device) -> RegionSetup:
    """Attach the object tagger that ``regions.tags`` asks for (it needs the run's tokenizer)."""
    if cfg.tags < 0:
        raise ConfigError(f"data.regions.tags: {cfg.tags} is negative (0 turns tags off)")
    if cfg.tags:
        from lait.models import ModelUnavailable
        from lait.train.regions import ObjectTags

        if cfg.source not in ("cnn", "shard"):
            raise ConfigError(f"data.regions.tags needs the CNN's features: source cnn, or shard regions it "
                              f"wrote (not {cfg.source})")
        try:
            setup.tags = ObjectTags(cfg, tokenizer, device)
        except ModelUnavailable as exc:
            raise ConfigError(f"data.regions.tags: {exc}") from None
    return setup


def build_model(model: str, regions: RegionSetup, init_from: str | None) -> ImageBert:
    """The named model config, its region width set by the region source, optionally BERT-initialised."""
    mcfg = ImageBertConfig.named(model)
    if regions.feature_dim is not None:
        mcfg.region_feature_dim = regions.feature_dim
    if regions.num_classes:
        mcfg.num_object_classes = regions.num_classes
    m = ImageBert(mcfg)
    if init_from:
        from lait.train.bert_init import load_bert_weights

        try:  # raises when missing or mismatched: never a silent random init
            load_bert_weights(m, init_from)
        except (OSError, KeyError, ValueError, ImportError) as exc:
            raise ConfigError(f"init_from: {exc.args[0] if exc.args else exc}") from None
    return m


def make_prepare(model: ImageBert, regions: RegionSetup, region_mask_prob: float) -> Callable[[Batch], Batch]:
    """On-device work before the forward: online region features, and a clear width check."""

    def prepare(batch: Batch) -> Batch:
        if regions.online is not None:
            batch = fill_regions(batch, regions.online, region_mask_prob)
        batch = add_tags(batch, regions.tags)
        d = batch.region_features.shape[-1]
        if d != model.config.region_feature_dim:
            raise ValueError(f"region features are {d}-d but the model expects {model.config.region_feature_dim}; set region_feature_dim in the model config")
        return batch

    return prepare


def stream_factory(urls: list[str], decoder: Decoder, batch_size: int, seed: int, collate_kwargs: dict,
                   rt: Runtime, data: DataConfig) -> Callable[[int], object]:
    def open_stream(skip: int):
        ds = ShardStream(urls, decoder, batch_size, seed, collate_kwargs, rt.rank, rt.world_size, data.shuffle_buffer, skip,
                         length_buckets=data.length_buckets)
        return make_loader(ds, data.num_workers, rt.device.type == "cuda")

    return open_stream


def stage_steps(stage: TrainStageConfig, urls: list[str], world: int, what: str = "shards") -> int:
    if stage.steps is not None:
        return stage.steps
    per_step = stage.batch_size * world * max(1, stage.optim.accum_steps)
    return max(1, math.floor(stage.epochs * count_samples(urls, what) / per_step))


def check_shard_regions(regions: RegionConfig, urls: list[str]) -> set[str] | None:
    """A ConfigError when the first shard is no readable tar with a sample, or, with
    ``regions.source: shard``, when its sample holds no region features (every sample would
    fail to decode). Returns the first sample's extensions (None for a remote shard)."""
    keys = first_sample_keys(urls[0])
    if regions.source == "shard" and keys is not None and not {"regions.npy", "boxes.npy"} <= keys:
        raise ConfigError(f"data.regions.source is shard, but the first sample of {urls[0]} has no "
                          "regions.npy/boxes.npy (shards built without region features); set "
                          "data.regions.source to patches, clip or detector")
    return keys


def check_tasks(tasks: TaskWeights, regions: RegionConfig, first: str, keys: set[str] | None, path: str) -> None:
    """A ConfigError when a task the stage weighs cannot run with its region source: MOC needs
    region classes, which a detector gives and shards may (labels.npy), and which pixel patches
    and CLIP patch tokens do not. Better than a task silently dropped from every step. `keys`:
    the extensions of the first sample of shard `first` (`check_shard_regions`)."""
    if not tasks.moc:
        return
    if regions.source in ("patches", "clip"):
        raise ConfigError(f"{path}.tasks.moc: masked object classification needs region classes, which "
                          f"data.regions.source={regions.source} does not give; set {path}.tasks.moc: 0, "
                          "or use regions from a detector or shards with labels.npy")
    if regions.source == "shard" and keys is not None and "labels.npy" not in keys:
        raise ConfigError(f"{path}.tasks.moc: masked object classification needs region classes, but the "
                          f"first sample of {first} has no labels.npy; set {path}.tasks.moc: 0")


def stage_shards(cfg: PretrainConfig, world_size: int) -> list[tuple[list[str], int]]:
    """(shard URLs, steps) of every stage, checked before any model loads or worker starts: a
    shard pattern that matches nothing, a missing sizes.json, a task the regions cannot feed."""
    out = []
    for i, stage in enumerate(cfg.stages):
        where = f"stages.{i}.shards"
        urls = expand_shards(stage.shards, where)
        check_enough_shards(urls, world_size, cfg.data.num_workers, where)
        keys = check_shard_regions(cfg.data.regions, urls)
        check_tasks(stage.tasks, cfg.data.regions, urls[0], keys, f"stages.{i}")
        out.append((urls, stage_steps(stage, urls, world_size, where)))
    return out


def run_pretrain(cfg: PretrainConfig) -> list[dict]:
    """Run every stage of ``cfg``; returns the per-step log records (rank 0 writes them to disk)."""
    rt = start_training(cfg)
    shards = stage_shards(cfg, rt.world_size)
    out = Path(cfg.output_dir)
    tok = default_tokenizer(cfg.data.tokenizer, cfg.init_from)
    cfg.data.tokenizer = tok.path  # resolved, so finetune and eval find it in the checkpoint
    regions = with_tags(region_setup(cfg.data.regions, rt.device), cfg.data.regions, tok, rt.device)
    model = build_model(cfg.model, regions, cfg.init_from)
    if tok.special.vocab_size > model.config.vocab_size:
        raise ConfigError(f"data.tokenizer: {tok.path} has {tok.special.vocab_size} tokens, but the model's "
                          f"vocabulary has {model.config.vocab_size}")
    if rt.is_main:
        cfg.write_resolved(out)
    decoder = Decoder(tok, cfg.data.regions.source, cfg.data.regions.image_size, regions.patches)
    plans = []
    for i, (stage, (urls, steps)) in enumerate(zip(cfg.stages, shards)):
        collate_kwargs = dict(
            special=tok.special, max_text_len=cfg.data.max_text_len, max_regions=cfg.data.regions.max_regions,
            mask_prob=cfg.mask_prob, region_mask_prob=cfg.region_mask_prob,
            itm_negative_prob=cfg.itm_negative_prob if stage.tasks.itm else 0.0, itm_negative=cfg.itm_negative,
        )
        log.info("stage/%s %d shards, %d steps", stage.name, len(urls), steps)
        plans.append(StagePlan(
            i, stage, steps,
            stream_factory(urls, decoder, stage.batch_size, cfg.seed * 1000 + i, collate_kwargs, rt, cfg.data),
            make_prepare(model, regions, cfg.region_mask_prob),
        ))
    from lait.train.objectives import PretrainTask

    # The task weights change per stage (`PretrainTask.start_stage`).
    task = PretrainTask(model, cfg.stages[0].tasks)
    return Trainer.for_run(task, model, rt, cfg).run(plans, resume=cfg.resume)


__all__ = ["RegionSetup", "build_model", "region_setup", "run_pretrain", "with_tags"]
