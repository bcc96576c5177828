"""Turning decoded samples into padded, masked training batches.

All randomness (ITM negatives, token and region masking) draws from a ``torch.Generator`` seeded
per batch by the data stream, so a batch is a pure function of (seed, rank, batch index): that is
what makes resume exact without saving worker RNG states.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

IGNORE = -100


@dataclass
class Example:
    """One decoded sample: caption token ids plus its image side."""

    key: str
    token_ids: list[int]  # WordPiece ids without special tokens
    image: torch.Tensor | None = None  # [3,S,S] float in [0,1], for on-the-fly region sources
    regions: np.ndarray | None = None  # [N,D] float features
    boxes: np.ndarray | None = None  # [N,4] normalised x1,y1,x2,y2
    labels: np.ndarray | None = None  # [N] int classes, or [N,C] soft class distributions


@dataclass
class Batch:
    """A padded batch; bool masks are True for real tokens/regions."""

    keys: list[str]
    input_ids: torch.Tensor  # [B,T]
    text_mask: torch.Tensor  # [B,T]
    mlm_labels: torch.Tensor  # [B,T], IGNORE where not masked
    itm_labels: torch.Tensor  # [B], 1 = matching pair
    region_draws: torch.Tensor  # [B,R,2] uniforms deciding region masking (applied once features exist)
    region_features: torch.Tensor | None = None  # [B,R,D] (masked) model input
    region_locations: torch.Tensor | None = None  # [B,R,5]
    region_valid: torch.Tensor | None = None  # [B,R]
    region_targets: torch.Tensor | None = None  # [B,R,D] unmasked features, MRFR target
    region_masked: torch.Tensor | None = None  # [B,R] regions whose losses count
    moc_labels: torch.Tensor | None = None  # [B,R] long (IGNORE) or [B,R,C] soft
    tag_ids: torch.Tensor | None = None  # [B,K] object tag word ids of the image side (regions.tags)
    tag_mask: torch.Tensor | None = None  # [B,K]
    images: torch.Tensor | None = None  # [B,3,S,S]
    image_index: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    # Flat positions of what the losses read, found on the host by `collate` (None: the losses
    # find them from the masks, which waits for the device): MLM's labelled tokens in [B*T],
    # the masked regions (MRFR) and those of them with a class (MOC) in [B*R].
    mlm_index: torch.Tensor | None = None
    region_index: torch.Tensor | None = None
    moc_index: torch.Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = True) -> "Batch":
        def move(v):
            return v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v

        return dataclasses.replace(self, **{f.name: move(getattr(self, f.name)) for f in dataclasses.fields(self)})

    def pin_memory(self) -> "Batch":  # called by DataLoader(pin_memory=True)
        return dataclasses.replace(
            self,
            **{f.name: getattr(self, f.name).pin_memory() for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), torch.Tensor)},
        )

    def tags_of(self, rows) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(tag ids, tag mask) of the image sides of some rows, or (None, None) without tags."""
        if self.tag_ids is None:
            return None, None
        return self.tag_ids[rows], self.tag_mask[rows]

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_tokens(self) -> int:
        n = int(self.text_mask.sum())
        if self.region_valid is not None:
            n += int(self.region_valid.sum())
        if self.tag_mask is not None:
            n += int(self.tag_mask.sum())
        return n


@dataclass
class SpecialTokens:
    cls: int
    sep: int
    mask: int
    pad: int
    vocab_size: int


def round_up(n: int, multiple: int = 8) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def box_locations(boxes: torch.Tensor) -> torch.Tensor:
    """[...,4] normalised x1,y1,x2,y2 -> the paper's 5-d location (x1, y1, x2, y2, area)."""
    area = (boxes[..., 2] - boxes[..., 0]).clamp_min(0) * (boxes[..., 3] - boxes[..., 1]).clamp_min(0)
    return torch.cat([boxes, area[..., None]], dim=-1)


def collate(
    examples: list[Example],
    special: SpecialTokens,
    max_text_len: int,
    max_regions: int,
    generator: torch.Generator,
    mask_prob: float = 0.15,
    region_mask_prob: float = 0.15,
    itm_negative_prob: float = 0.0,
    itm_negative: str = "image",
    trim_regions: bool = False,
) -> Batch:
    """Pad, pair (ITM negatives by in-batch swaps), and mask tokens; regions are masked too when
    their features are already known (shard or pixel sources)."""
    b = len(examples)
    # The draws happen in a fixed order (pairs, tokens, regions): a batch is a function of the seed.
    image_index, text_index, itm = itm_pairs(b, generator, itm_negative_prob, itm_negative)
    ids = pad_texts([examples[int(i)].token_ids for i in text_index], special, max_text_len)
    text_mask = ids != special.pad
    input_ids, mlm_labels = mask_tokens(ids, text_mask, itm, special, generator, mask_prob)
    r = round_up(max_regions)
    batch = Batch(
        keys=[examples[int(i)].key for i in text_index],
        input_ids=input_ids,
        text_mask=text_mask,
        mlm_labels=mlm_labels,
        itm_labels=itm,
        region_draws=torch.rand(b, r, 2, generator=generator),
        image_index=image_index,
    )
    batch.mlm_index = flat_index(mlm_labels != IGNORE)
    sides = [examples[int(i)] for i in image_index]
    if sides[0].image is not None:
        batch.images = torch.stack([s.image for s in sides])
    if sides[0].regions is not None:
        # With `trim_regions`, padded to the batch's most regions (rounded up) rather than to
        # max_regions: padding is compute that counts for nothing. The masking draws are the
        # same either way; dropout's are not (they follow the tensor's shape).
        width = min(r, round_up(max(min(len(s.regions), r) for s in sides))) if trim_regions else r
        feats, locs, valid, labels = pad_regions(sides, width)
        set_regions(batch, feats, locs, valid, labels, region_mask_prob)
        batch.region_index = flat_index(batch.region_masked)
        if labels is not None and labels.dim() == 2:
            batch.moc_index = flat_index(batch.region_masked & (labels != IGNORE))
        elif labels is not None:
            batch.moc_index = batch.region_index
    return batch


def flat_index(mask: torch.Tensor) -> torch.Tensor:
    """Positions of the True entries of a mask, flattened row-major (the order of `x[mask]`)."""
    return torch.nonzero(mask.reshape(-1), as_tuple=True)[0]


def itm_pairs(b: int, generator: torch.Generator, negative_prob: float,
              negative: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(image index, text index, ITM label) per row: with probability ``negative_prob`` row i keeps
    its text and takes another sample's image (``negative="image"``), or the reverse."""
    image_index = torch.arange(b)
    text_index = torch.arange(b)
    itm = torch.ones(b, dtype=torch.long)
    if negative_prob > 0 and b > 1:
        neg = torch.rand(b, generator=generator) < negative_prob
        other = (torch.arange(b) + torch.randint(1, b, (b,), generator=generator)) % b  # never i
        if negative == "image":
            image_index = torch.where(neg, other, image_index)
        elif negative == "text":
            text_index = torch.where(neg, other, text_index)
        else:
            raise ValueError(f"itm_negative must be 'image' or 'text', not {negative!r}")
        itm = (~neg).long()
    return image_index, text_index, itm


def pad_texts(token_ids: list[list[int]], special: SpecialTokens, max_text_len: int) -> torch.Tensor:
    """[CLS] tokens [SEP], truncated to ``max_text_len`` and padded to a multiple of 8: [B,T]."""
    texts = [toks[: max_text_len - 2] for toks in token_ids]
    ids = torch.full((len(texts), round_up(max(len(x) for x in texts) + 2)), special.pad, dtype=torch.long)
    for row, toks in enumerate(texts):
        ids[row, : len(toks) + 2] = torch.tensor([special.cls, *toks, special.sep])
    return ids


def mask_tokens(ids: torch.Tensor, text_mask: torch.Tensor, itm: torch.Tensor, special: SpecialTokens,
                generator: torch.Generator, mask_prob: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, MLM labels). MLM: ``mask_prob`` of real tokens; 80% [MASK], 10% random, 10%
    kept. Every pair is masked alike, but only matching pairs get labels (conditional masking):
    masking positives only would let ITM read "has [MASK]" as "matches", and then fail on the
    unmasked pairs of retrieval."""
    b, t = ids.shape
    maskable = text_mask & (ids != special.cls) & (ids != special.sep)
    u = torch.rand(b, t, 2, generator=generator)
    chosen = maskable & (u[..., 0] < mask_prob)
    mlm_labels = torch.where(chosen & (itm[:, None] == 1), ids, torch.full_like(ids, IGNORE))
    random_ids = torch.randint(0, special.vocab_size, (b, t), generator=generator)
    input_ids = torch.where(chosen & (u[..., 1] < 0.8), torch.full_like(ids, special.mask), ids)
    input_ids = torch.where(chosen & (u[..., 1] >= 0.8) & (u[..., 1] < 0.9), random_ids, input_ids)
    return input_ids, mlm_labels


def pad_regions(sides: list[Example], r: int):
    """Stack per-sample region arrays, truncated to the first ``r`` (detectors sort by score).
    Features keep the shards' fp16 when every sample has it (half the bytes to the device)."""
    b, d = len(sides), sides[0].regions.shape[1]
    half = all(np.asarray(s.regions).dtype == np.float16 for s in sides)
    feats = torch.zeros(b, r, d, dtype=torch.float16 if half else torch.float32)
    locs = torch.zeros(b, r, 5)
    valid = torch.zeros(b, r, dtype=torch.bool)
    soft = sides[0].labels is not None and sides[0].labels.ndim == 2
    labels = None
    if sides[0].labels is not None:
        labels = torch.zeros(b, r, sides[0].labels.shape[1]) if soft else torch.full((b, r), IGNORE, dtype=torch.long)
    # Filled through numpy views: the shards' arrays may be read-only views on the tar's bytes.
    feats_np, labels_np = feats.numpy(), None if labels is None else labels.numpy()
    for i, s in enumerate(sides):
        n = min(r, len(s.regions))
        feats_np[i, :n] = s.regions[:n]
        locs[i, :n] = box_locations(torch.from_numpy(np.array(s.boxes[:n], dtype=np.float32)))
        valid[i, :n] = True
        if labels_np is not None and s.labels is not None:
            labels_np[i, :n] = s.labels[:n]
    return feats, locs, valid, labels


def set_regions(batch: Batch, feats, locs, valid, labels, region_mask_prob: float) -> Batch:
    """Attach region features and mask 15% of regions (90% zeroed, 10% kept); as for tokens, all
    pairs are masked alike and only matching pairs' masked regions count in the losses."""
    r = feats.shape[1]
    draws = batch.region_draws[:, :r]
    chosen = valid & (draws[..., 0] < region_mask_prob)
    zeroed = chosen & (draws[..., 1] < 0.9)
    masked = chosen & (batch.itm_labels[:, None] == 1).to(valid.device)
    batch.region_targets = feats
    batch.region_features = feats.masked_fill(zeroed[..., None], 0.0)
    batch.region_locations = locs
    batch.region_valid = valid
    batch.region_masked = masked
    batch.moc_labels = labels
    batch.region_index = batch.moc_index = None  # found again by whoever set new masks
    return batch
