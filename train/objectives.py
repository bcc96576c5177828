"""The four pretraining tasks of ImageBERT as one module, so DDP sees a single forward.

``PretrainTask(batch)`` returns ``(loss, losses, report)``: the weighted sum to backpropagate,
each task's loss tensor, and float metrics for the logs. Masked losses only count on matching
pairs; ``collate`` already restricted the masks to them (conditional masking).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lait.train.batch import IGNORE, Batch
from lait.train.config import TaskWeights, TrainStageConfig
from lait.train.model import TEMPERATURE, ImageBert


def _mean_over(total: torch.Tensor, n: int) -> torch.Tensor:
    # Sum / max(n, 1) instead of a mean: an empty selection gives 0 (still in the graph, so DDP
    # and gradient accumulation see every head every step) rather than NaN.
    return total / max(n, 1)


def _select(x: torch.Tensor, mask: torch.Tensor, index: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """The rows of `x` ([B, N, ...]) where `mask` ([B, N]) is set, and how many: by `index` (their
    flat positions, found on the host by `collate`) without waiting for the device, else by the
    mask (which asks the device how many there are)."""
    if index is not None:
        return x.reshape(-1, *x.shape[2:]).index_select(0, index), index.numel()
    rows = x[mask]
    return rows, rows.shape[0]


def _accuracy(logits: torch.Tensor, target: torch.Tensor, n: int) -> torch.Tensor | float:
    """Share of rows whose arg-max is the target, as a tensor on the device (read at log time)."""
    return (logits.argmax(-1) == target).float().mean().detach() if n else float("nan")


def _cross_entropy(head, hidden: torch.Tensor, labels: torch.Tensor, sel: torch.Tensor | None,
                   index: torch.Tensor | None):
    """Cross-entropy of `head` on the selected rows: (mean loss, accuracy, rows)."""
    rows, n = _select(hidden, sel, index)
    target, _ = _select(labels, sel, index)
    logits = head(rows).float()
    return _mean_over(F.cross_entropy(logits, target, reduction="sum"), n), _accuracy(logits, target, n), n


def mlm_loss(model: ImageBert, text_hidden: torch.Tensor, labels: torch.Tensor, index: torch.Tensor | None = None):
    sel = labels != IGNORE if index is None else None
    loss, acc, n = _cross_entropy(model.mlm_logits, text_hidden, labels, sel, index)
    return loss, {"mlm_acc": acc, "mlm_tokens": float(n)}


def moc_loss(model: ImageBert, region_hidden: torch.Tensor, masked: torch.Tensor, labels: torch.Tensor,
             index: torch.Tensor | None = None):
    """Masked object classification: CE on hard labels, or KL(target || prediction) on soft ones."""
    if labels.dim() == 3:  # soft labels [B,R,C]
        hidden, n = _select(region_hidden, masked if index is None else None, index)
        target, _ = _select(labels, masked if index is None else None, index)
        logp = F.log_softmax(model.moc_head(hidden).float(), -1)
        return _mean_over(F.kl_div(logp, target.float(), reduction="sum"), n), {"moc_regions": float(n)}
    sel = masked & (labels != IGNORE) if index is None else None
    loss, acc, n = _cross_entropy(model.moc_head, region_hidden, labels, sel, index)
    return loss, {"moc_acc": acc, "moc_regions": float(n)}


def mrfr_loss(model: ImageBert, region_hidden: torch.Tensor, masked: torch.Tensor, targets: torch.Tensor,
              index: torch.Tensor | None = None):
    """Masked region feature regression: L2 to the input feature, averaged over its dimensions so
    that the loss scale does not depend on the feature width (2048 for detectors, 768 for CLIP)."""
    sel = masked if index is None else None
    hidden, n = _select(region_hidden, sel, index)
    target, _ = _select(targets, sel, index)
    pred = model.mrfr_head(hidden).float()
    sq = (pred - target.float()).pow(2).mean(-1)
    return _mean_over(sq.sum(), n), {"mrfr_regions": float(n)}


def itm_loss(model: ImageBert, cls_hidden: torch.Tensor, labels: torch.Tensor):
    logits = model.itm_logits(cls_hidden).float()
    loss = F.cross_entropy(logits, labels)
    return loss, {"itm_acc": _accuracy(logits, labels, 1)}


def itc_loss(model: ImageBert, batch: Batch, temperature: float):
    """Symmetric in-batch contrastive loss between unimodal text and region embeddings.

    Only matching rows take part: their images are distinct (an ITM negative row reuses another
    row's image, which would be a false negative). Texts are fed unmasked (MLM labels restore the
    masked tokens of matching rows) and regions unmasked (the MRFR targets).
    """
    pos = batch.itm_labels == 1
    n = int(pos.sum())
    if n < 2:
        zero = sum(p.sum() * 0.0 for p in model.embed_head.parameters())
        return zero, {"itc_acc": float("nan")}
    ids = torch.where(batch.mlm_labels != IGNORE, batch.mlm_labels, batch.input_ids)[pos]
    mask = batch.text_mask[pos]
    t = model.embed(model(ids, mask, None, None, None), mask)
    valid = batch.region_valid[pos]
    tags, tag_mask = batch.tags_of(pos)
    h = model(None, None, batch.region_targets[pos], batch.region_locations[pos], valid, tags, tag_mask)
    i = model.embed(h, model.image_mask(tag_mask, valid))
    sim = t @ i.t() / temperature
    target = torch.arange(n, device=sim.device)
    loss = (F.cross_entropy(sim, target) + F.cross_entropy(sim.t(), target)) / 2
    return loss, {"itc_acc": _accuracy(sim, target, n)}


class PretrainTask(nn.Module):
    """MLM + MOC + MRFR + ITM on ``[CLS] text [SEP] (tags) regions``, optionally ITC on unimodal passes."""

    def __init__(self, model: ImageBert, weights: TaskWeights):
        super().__init__()
        self.model = model
        self.weights = weights

    def start_stage(self, stage: TrainStageConfig) -> None:
        """Each pretraining stage trains with its own task weights (called by the Trainer)."""
        self.weights = stage.tasks

    def forward(self, batch: Batch):
        m = self.model
        hidden = m(batch.input_ids, batch.text_mask, batch.region_features, batch.region_locations, batch.region_valid,
                   batch.tag_ids, batch.tag_mask)
        t = batch.input_ids.shape[1]
        k = 0 if batch.tag_ids is None else batch.tag_ids.shape[1]
        text_h, region_h = hidden[:, :t], hidden[:, t + k:]
        w = self.weights
        losses: dict[str, torch.Tensor] = {}
        report: dict[str, float] = {}
        if w.mlm:
            losses["mlm"], r = mlm_loss(m, text_h, batch.mlm_labels, batch.mlm_index)
            report.update(r)
        if w.moc and batch.moc_labels is not None:
            losses["moc"], r = moc_loss(m, region_h, batch.region_masked, batch.moc_labels, batch.moc_index)
            report.update(r)
        if w.mrfr:
            losses["mrfr"], r = mrfr_loss(m, region_h, batch.region_masked, batch.region_targets, batch.region_index)
            report.update(r)
        if w.itm:
            losses["itm"], r = itm_loss(m, hidden[:, 0], batch.itm_labels)
            report.update(r)
        if w.itc:
            losses["itc"], r = itc_loss(m, batch, TEMPERATURE)
            report.update(r)
        total = sum(getattr(w, k) * v for k, v in losses.items())
        return total, losses, report
