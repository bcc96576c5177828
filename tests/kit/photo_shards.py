"""Shards of real photos with human captions (a Karpathy-style split), with real region features.

For learning on real photos offline (bench/learning/flickr8k.py, the slow test of it): one sample
per caption, each carrying its photo, and the regions the trainer's `cnn` source computes from
that photo (the packaged EfficientNet-Lite0's feature map cells and their ImageNet labels), so
that training reads them from the shards and evaluation recomputes them identically from the
JPEGs (`--set data.regions.source=cnn`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kit.synthetic_shards import SyntheticSample, write_shards


def split_items(karpathy_json: str | Path, split: str, limit: int | None = None) -> list[dict]:
    """The images of one split of a Karpathy-style JSON, in file order."""
    data = json.loads(Path(karpathy_json).read_text())
    items = [it for it in data["images"] if it.get("split") == split]
    return items[:limit] if limit else items


def photo_samples(karpathy_json: str | Path, image_root: str | Path, split: str, max_regions: int,
                  limit: int | None = None, batch: int = 64) -> list[SyntheticSample]:
    """One sample per (photo, caption) of the split, with cnn regions, boxes and labels."""
    import torch

    from lait.train.config import RegionConfig
    from lait.train.data import image_tensor
    from lait.train.regions import CnnRegions

    cfg = RegionConfig(source="cnn", max_regions=max_regions)
    regions = CnnRegions(cfg, cfg.max_regions).eval()
    root = Path(image_root)
    items = split_items(karpathy_json, split, limit)
    out = []
    for i in range(0, len(items), batch):
        chunk = items[i:i + batch]
        raws = [(root / it.get("filepath", "") / it["filename"]).read_bytes() for it in chunk]
        feats, boxes, _, labels = regions(torch.stack([image_tensor(r, cfg.image_size) for r in raws]))
        for it, raw, f, b, lab in zip(chunk, raws, feats, boxes, labels, strict=True):
            stem = Path(it["filename"]).stem
            for j, sent in enumerate(it["sentences"]):
                out.append(SyntheticSample(f"{stem}_{j}", sent["raw"], {"source": "karpathy", "split": split}, raw,
                                           f.half().numpy(), b.numpy(), lab.int().numpy()))
    return out


def write_photo_shards(out_dir: str | Path, samples: list[SyntheticSample], per_shard: int, seed: int = 0) -> list[Path]:
    """Shuffled (the captions of one photo spread over the shards), then written with sizes.json."""
    order = np.random.default_rng(seed).permutation(len(samples))
    return write_shards(out_dir, [samples[i] for i in order], per_shard)
