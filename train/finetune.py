"""``lait train finetune``: image-text retrieval finetuning of the ITM head.

Losses (``loss``): ``binary`` (match / no match, classes balanced), ``multiclass`` (the positive
against K negatives, softmax over their ITM scores, both directions, as the paper's best), or
``triplet`` (hinge on the hardest of K negatives). Negatives are mined in the batch by embedding
similarity (``hard_negatives``; the most similar, or drawn by similarity with ``hard_sampling:
softmax``) or drawn at random. The embeddings come from the model's
unimodal passes (text alone, regions alone) and an embedding head trained here with an in-batch
contrastive loss; the same embeddings build the evaluator's faiss shortlist.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from lait.train.batch import Batch
from lait.train.config import FinetuneConfig
from lait.train.model import TEMPERATURE, ImageBert, ImageBertConfig

log = logging.getLogger(__name__)


def load_trained(path: str | Path) -> tuple[ImageBert, dict]:
    """An ImageBERT and its run config from a lait checkpoint (weights_only load)."""
    from lait.config import ConfigError, build
    from lait.train.checkpoint import load_checkpoint, load_weights

    ck = load_checkpoint(path)
    config = ck.get("config") or {}
    if not isinstance(ck["model_config"], dict) or not isinstance(config, dict):
        raise ConfigError(f"checkpoint {path}: not a lait checkpoint (its model_config or config is no mapping)")
    model = ImageBert(build(ImageBertConfig, ck["model_config"], where=f"checkpoint {path}", path="model_config"))
    load_weights(model, ck["model"], path)
    return model, config


def text_embeddings(model: ImageBert, batch: Batch) -> torch.Tensor:
    return model.embed(model(batch.input_ids, batch.text_mask, None, None, None), batch.text_mask)


def image_embeddings(model: ImageBert, batch: Batch) -> torch.Tensor:
    h = model(None, None, batch.region_features, batch.region_locations, batch.region_valid, batch.tag_ids, batch.tag_mask)
    return model.embed(h, model.image_mask(batch.tag_mask, batch.region_valid))


def mine_negatives(sim: torch.Tensor, k: int, hard: bool, generator: torch.Generator | None = None,
                   sampled: bool = False) -> torch.Tensor:
    """[B,B] similarities (row = query) -> [B,k] indices of non-matching columns: the k most
    similar (`hard`), k drawn with probability softmax(similarity / TEMPERATURE) (`hard` and
    `sampled`: ALBEF's mining, Li et al. 2021), or k at random."""
    b = sim.shape[0]
    k = min(k, b - 1)
    if hard and sampled:
        # On the CPU, as the random draw: a CPU generator cannot draw on another device.
        w = torch.softmax(sim.detach().float().cpu() / TEMPERATURE, dim=1) + 1e-4  # every non-match can be drawn
        w.fill_diagonal_(0.0)
        return torch.multinomial(w, k, replacement=False, generator=generator).to(sim.device)
    if hard:
        s = sim.detach().float().clone()
        s.fill_diagonal_(float("-inf"))
        return s.topk(k, dim=1).indices
    noise = torch.rand(b, b, generator=generator).to(sim.device)
    noise.fill_diagonal_(-1.0)
    return noise.topk(k, dim=1).indices


class FinetuneTask(nn.Module):
    """ITM retrieval loss over positives and mined negatives, plus the embedding contrastive loss."""

    def __init__(self, model: ImageBert, loss: str, num_negatives: int, hard_negatives: bool, margin: float,
                 contrastive_weight: float, binary_weight: float = 0.0, hard_sampling: str = "top"):
        super().__init__()
        if loss not in ("binary", "multiclass", "triplet"):
            raise ValueError(f"loss must be binary, multiclass or triplet, not {loss!r}")
        if hard_sampling not in ("top", "softmax"):
            raise ValueError(f"hard_sampling must be top or softmax, not {hard_sampling!r}")
        self.model, self.loss, self.k, self.hard = model, loss, num_negatives, hard_negatives
        self.margin, self.contrastive_weight, self.binary_weight = margin, contrastive_weight, binary_weight
        self.sampled = hard_sampling == "softmax"

    def pair_scores(self, batch: Batch, text_idx: torch.Tensor, image_idx: torch.Tensor) -> torch.Tensor:
        """ITM logits [N,2] of (text_idx[n], image_idx[n]) pairs, in one forward pass."""
        m = self.model
        h = m(batch.input_ids[text_idx], batch.text_mask[text_idx], batch.region_features[image_idx],
              batch.region_locations[image_idx], batch.region_valid[image_idx], *batch.tags_of(image_idx))
        return m.itm_logits(h[:, 0]).float()

    def forward(self, batch: Batch):
        b = batch.size
        t_emb, i_emb = text_embeddings(self.model, batch), image_embeddings(self.model, batch)
        sim = t_emb @ i_emb.t()  # [text, image]
        target = torch.arange(b, device=sim.device)
        itc = (F.cross_entropy(sim / TEMPERATURE, target) + F.cross_entropy(sim.t() / TEMPERATURE, target)) / 2
        neg_img = mine_negatives(sim, self.k, self.hard, sampled=self.sampled)  # for each text
        neg_txt = mine_negatives(sim.t(), self.k, self.hard, sampled=self.sampled)  # for each image
        k = neg_img.shape[1]
        # Pairs: B positives, then B*k (text, negative image), then B*k (negative text, image).
        ar = target
        text_idx = torch.cat([ar, ar.repeat_interleave(k), neg_txt.reshape(-1)])
        image_idx = torch.cat([ar, neg_img.reshape(-1), ar.repeat_interleave(k)])
        logits = self.pair_scores(batch, text_idx, image_idx)
        score = logits[:, 1] - logits[:, 0]
        pos, neg_i, neg_t = score[:b], score[b : b + b * k].view(b, k), score[b + b * k :].view(b, k)
        if self.loss == "binary" or self.binary_weight:
            labels = torch.zeros(len(score), dtype=torch.long, device=score.device)
            labels[:b] = 1
            per = F.cross_entropy(logits, labels, reduction="none")
            binary = (per[:b].mean() + per[b:].mean()) / 2  # balance 1 positive against 2k negatives
        if self.loss == "binary":
            itm = binary
        elif self.loss == "multiclass":
            zeros = torch.zeros(b, dtype=torch.long, device=score.device)
            itm = (F.cross_entropy(torch.cat([pos[:, None], neg_i], 1), zeros)
                   + F.cross_entropy(torch.cat([pos[:, None], neg_t], 1), zeros)) / 2
        else:
            hardest = torch.maximum(neg_i.max(1).values, neg_t.max(1).values)
            itm = F.relu(self.margin - pos + hardest).mean()
        total = itm + self.contrastive_weight * itc
        losses = {"itm": itm, "itc": itc}
        if self.loss != "binary" and self.binary_weight:
            total = total + self.binary_weight * binary
            losses["itm_binary"] = binary
        acc = (pos[:, None] > torch.cat([neg_i, neg_t], 1)).all(1).float().mean().item()
        return total, losses, {"rank_acc": acc}


def run_finetune(cfg: FinetuneConfig) -> list[dict]:
    """Finetune for retrieval; returns the per-step log records."""
    from lait.train.data import check_enough_shards, default_tokenizer, expand_shards
    from lait.train.loop import StagePlan, Trainer
    from lait.train.pretrain import (
        Decoder,
        build_model,
        check_shard_regions,
        make_prepare,
        region_setup,
        stage_steps,
        stream_factory,
        with_tags,
    )
    from lait.train.runtime import start_training

    rt = start_training(cfg)
    urls = expand_shards(cfg.stage.shards, "stage.shards")  # checked before any model loads
    check_enough_shards(urls, rt.world_size, cfg.data.num_workers, "stage.shards")
    check_shard_regions(cfg.data.regions, urls)
    steps = stage_steps(cfg.stage, urls, rt.world_size, "stage.shards")
    regions = region_setup(cfg.data.regions, rt.device)
    if cfg.init_from and str(cfg.init_from).endswith(".pt"):
        model, src_cfg = load_trained(cfg.init_from)
        cfg.data.tokenizer = cfg.data.tokenizer or (src_cfg.get("data") or {}).get("tokenizer")
        tok = default_tokenizer(cfg.data.tokenizer, None)
    else:  # a BERT directory (or nothing): start from the named model config
        tok = default_tokenizer(cfg.data.tokenizer, cfg.init_from)
        model = build_model(cfg.model, regions, cfg.init_from)
    cfg.data.tokenizer = tok.path
    with_tags(regions, cfg.data.regions, tok, rt.device)
    out = Path(cfg.output_dir)
    if rt.is_main:
        cfg.write_resolved(out)
    if cfg.stage.name == "stage":
        cfg.stage.name = "finetune"
    collate_kwargs = dict(special=tok.special, max_text_len=cfg.data.max_text_len, max_regions=cfg.data.regions.max_regions,
                          mask_prob=0.0, region_mask_prob=0.0, itm_negative_prob=0.0)
    decoder = Decoder(tok, cfg.data.regions.source, cfg.data.regions.image_size, regions.patches)
    plan = StagePlan(0, cfg.stage, steps,
                     stream_factory(urls, decoder, cfg.stage.batch_size, cfg.seed * 1000 + 17, collate_kwargs, rt, cfg.data),
                     make_prepare(model, regions, 0.0))
    task = FinetuneTask(model, cfg.loss, cfg.num_negatives, cfg.hard_negatives, cfg.margin, cfg.contrastive_weight,
                        cfg.binary_weight, cfg.hard_sampling)
    return Trainer.for_run(task, model, rt, cfg).run([plan], resume=cfg.resume)
