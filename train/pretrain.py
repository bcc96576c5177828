"""``lait train pretrain``: ImageBERT multi-stage pretraining on lait shards.

Each stage (e.g. the paper's large out-of-domain web data, then in-domain data) has its own
shards, steps, batch size, optimiser settings and task weights, and starts from the weights the
previous stage ended with.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import torch

from .batch import Batch
from .config import DataConfig, PretrainConfig, RegionConfig, TrainStageConfig
from .data import Decoder, ShardStream, check_enough_shards, count_samples, default_tokenizer, expand_shards, make_loader
from .loop import StagePlan, Trainer
from .model import ImageBert, ImageBertConfig
from .regions import PatchPooling, build_online_regions, fill_regions
from .runtime import Runtime, seed_everything, setup_runtime

log = logging.getLogger(__name__)


@dataclass
class RegionSetup:
    """What the region source implies: worker-side patch pooling or an on-device frozen model."""

    patches: PatchPooling | None
    online: torch.nn.Module | None
    feature_dim: int | None  # None: whatever the shards hold (checked on the first batch)
    num_classes: int | None


def region_setup(cfg: RegionConfig, device: torch.device) -> RegionSetup:
    if cfg.source == "patches":
        p = PatchPooling(cfg.patch_grid[0], cfg.patch_grid[1], cfg.patch_pixels)
        if p.rows * p.cols > cfg.max_regions:
            raise ValueError(f"regions.patch_grid {cfg.patch_grid} gives more cells than max_regions={cfg.max_regions}")
        return RegionSetup(p, None, p.feature_dim, None)
    online = build_online_regions(cfg)
    if online is None:
        return RegionSetup(None, None, None, None)
    return RegionSetup(None, online.to(device), online.feature_dim, online.num_classes or None)


def build_model(model: str, regions: RegionSetup, init_from: str | None) -> ImageBert:
    """The named model config, its region width set by the region source, optionally BERT-initialised."""
    mcfg = ImageBertConfig.named(model)
    if regions.feature_dim is not None:
        mcfg.region_feature_dim = regions.feature_dim
    if regions.num_classes:
        mcfg.num_object_classes = regions.num_classes
    m = ImageBert(mcfg)
    if init_from:
        from .bert_init import load_bert_weights

        load_bert_weights(m, init_from)  # raises when missing or mismatched: never a silent random init
    return m


def make_prepare(model: ImageBert, regions: RegionSetup, region_mask_prob: float) -> Callable[[Batch], Batch]:
    """On-device work before the forward: online region features, and a clear width check."""

    def prepare(batch: Batch) -> Batch:
        if regions.online is not None:
            batch = fill_regions(batch, regions.online, region_mask_prob)
        d = batch.region_features.shape[-1]
        if d != model.config.region_feature_dim:
            raise ValueError(f"region features are {d}-d but the model expects {model.config.region_feature_dim}; set region_feature_dim in the model config")
        return batch

    return prepare


def stream_factory(urls: list[str], decoder: Decoder, batch_size: int, seed: int, collate_kwargs: dict,
                   rt: Runtime, data: DataConfig) -> Callable[[int], object]:
    def open_stream(skip: int):
        ds = ShardStream(urls, decoder, batch_size, seed, collate_kwargs, rt.rank, rt.world_size, data.shuffle_buffer, skip)
        return make_loader(ds, data.num_workers, rt.device.type == "cuda")

    return open_stream


def stage_steps(stage: TrainStageConfig, urls: list[str], world: int) -> int:
    if stage.steps is not None:
        return stage.steps
    per_step = stage.batch_size * world * max(1, stage.optim.accum_steps)
    return max(1, math.floor(stage.epochs * count_samples(urls) / per_step))


def run_pretrain(cfg: PretrainConfig) -> list[dict]:
    """Run every stage of ``cfg``; returns the per-step log records (rank 0 writes them to disk)."""
    cfg.validate()
    rt = setup_runtime(cfg.device, cfg.precision, cfg.cpu_threads)
    seed_everything(cfg.seed + rt.rank)
    out = Path(cfg.output_dir)
    tok = default_tokenizer(cfg.data.tokenizer, cfg.init_from)
    cfg.data.tokenizer = tok.path  # resolved, so finetune and eval find it in the checkpoint
    if rt.is_main:
        cfg.write_resolved(out)
    regions = region_setup(cfg.data.regions, rt.device)
    model = build_model(cfg.model, regions, cfg.init_from)
    if tok.special.vocab_size > model.config.vocab_size:
        raise ValueError(f"tokenizer {tok.path} has {tok.special.vocab_size} tokens, model vocab is {model.config.vocab_size}")
    decoder = Decoder(tok, cfg.data.regions.source, cfg.data.regions.image_size, regions.patches)
    plans = []
    for i, stage in enumerate(cfg.stages):
        urls = expand_shards(stage.shards)
        check_enough_shards(urls, rt.world_size, cfg.data.num_workers, f"stage {stage.name!r}")
        collate_kwargs = dict(
            special=tok.special, max_text_len=cfg.data.max_text_len, max_regions=cfg.data.regions.max_regions,
            mask_prob=cfg.mask_prob, region_mask_prob=cfg.region_mask_prob,
            itm_negative_prob=cfg.itm_negative_prob if stage.tasks.itm else 0.0, itm_negative=cfg.itm_negative,
        )
        steps = stage_steps(stage, urls, rt.world_size)
        log.info("stage/%s %d shards, %d steps", stage.name, len(urls), steps)
        plans.append(StagePlan(
            i, stage, steps,
            stream_factory(urls, decoder, stage.batch_size, cfg.seed * 1000 + i, collate_kwargs, rt, cfg.data),
            make_prepare(model, regions, cfg.region_mask_prob),
        ))
    from .objectives import PretrainTask

    # The task weights change per stage; the task module reads them from the plan's config.
    task = PretrainTask(model, cfg.stages[0].tasks)
    trainer = Trainer(task, model, rt, out, cfg.to_dict(), log_every=cfg.log_every, checkpoint_every=cfg.checkpoint_every,
                      keep_checkpoints=cfg.keep_checkpoints, tensorboard=cfg.tensorboard, peak_flops=cfg.peak_flops,
                      num_workers=cfg.data.num_workers)
    for plan in plans:
        plan.on_start = partial(setattr, task, "weights", plan.config.tasks)
    return trainer.run(plans, resume=cfg.resume)


__all__ = ["RegionSetup", "build_model", "region_setup", "run_pretrain"]
