"""Small synthetic shards in the lait shard format, for tests, benchmarks and demos.

``object_samples`` gives captions naming objects whose region features are class prototypes plus
noise (every task has signal to learn); ``scene_samples`` renders the built-in shapes scenes
(``lait.testkit.scenes``) as JPEGs with their captions, for pixel-based region sources.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

WORDS = ["dog", "cat", "car", "tree", "boat", "horse", "chair", "cup", "bird", "house",
         "train", "clock", "apple", "bench", "kite", "plane", "sheep", "pizza", "phone", "vase"]


@dataclass
class SyntheticSample:
    """One shard sample; ``None`` members are not written."""

    key: str
    caption: str
    meta: dict = field(default_factory=dict)
    jpg: bytes | None = None
    regions: np.ndarray | None = None
    boxes: np.ndarray | None = None
    labels: np.ndarray | None = None


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def write_shards(out_dir: str | Path, samples: Iterable[SyntheticSample], per_shard: int) -> list[Path]:
    """Write ``NNNNN.tar`` files plus ``sizes.json``; returns the tar paths. A sample's ``.json``
    records its image's SHA-256 as lait build does: ``sha256`` of the image member's bytes
    exactly, and ``fetched_sha256`` the same (an image shipped as it was fetched); ``meta``
    overrides either."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sizes: dict[str, int] = {}
    paths: list[Path] = []
    tar = None
    for i, s in enumerate(samples):
        if i % per_shard == 0:
            if tar:
                tar.close()
            name = f"{len(paths):05d}.tar"
            paths.append(out / name)
            tar = tarfile.open(out / name, "w")
            sizes[name] = 0
        sha = None if s.jpg is None else hashlib.sha256(s.jpg).hexdigest()
        digest = {} if sha is None else {"sha256": sha, "fetched_sha256": sha}
        members = {"txt": s.caption.encode(), "json": json.dumps({"key": s.key, **digest, **s.meta}).encode()}
        if s.jpg is not None:
            members["jpg"] = s.jpg
        for ext, arr in (("regions.npy", s.regions), ("boxes.npy", s.boxes), ("labels.npy", s.labels)):
            if arr is not None:
                members[ext] = _npy(arr)
        for ext, data in members.items():
            info = tarfile.TarInfo(f"{s.key}.{ext}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        sizes[paths[-1].name] += 1
    if tar:
        tar.close()
    (out / "sizes.json").write_text(json.dumps(sizes))
    return paths


def object_samples(n: int, seed: int = 0, feature_dim: int = 16, num_classes: int = 10, max_objects: int = 4,
                   soft_labels: bool = False) -> list[SyntheticSample]:
    """Captions like "a dog and a cup" with one region per named object (prototype + noise)."""
    rng = np.random.default_rng(seed)
    protos = np.random.default_rng(1234).normal(size=(num_classes, feature_dim)).astype(np.float32)
    out = []
    for i in range(n):
        k = int(rng.integers(1, max_objects + 1))
        classes = rng.choice(num_classes, size=k, replace=False)
        # Each class has its own place in the image, so a masked region's class and feature can
        # be inferred from its location as well as from the caption.
        xy = np.stack([classes / num_classes * 0.6, (classes * 7 % num_classes) / num_classes * 0.6], 1)
        xy = np.clip(xy + rng.normal(scale=0.02, size=(k, 2)), 0, 0.6)
        wh = rng.uniform(0.1, 0.4, size=(k, 2))
        boxes = np.concatenate([xy, xy + wh], 1).astype(np.float32)
        feats = (protos[classes] + 0.3 * rng.normal(size=(k, feature_dim))).astype(np.float16)
        if soft_labels:
            labels = np.full((k, num_classes), 0.05 / max(1, num_classes - 1), dtype=np.float32)
            labels[np.arange(k), classes] = 0.95
        else:
            labels = classes.astype(np.int64)
        caption = "a photo of " + " and ".join(f"a {WORDS[c % len(WORDS)]}" for c in classes)
        out.append(SyntheticSample(f"{i:06d}", caption, {"source": "synthetic"}, None, feats, boxes, labels))
    return out


def scene_samples(n: int, seed: int = 0, width: int = 192, height: int = 160, quality: int = 90) -> list[SyntheticSample]:
    """Rendered shapes scenes (JPEG) with their English captions."""
    from lait.testkit.scenes import describe, random_scene, render_scene

    rng = random.Random(seed)
    out = []
    for i in range(n):
        scene = random_scene(rng)
        img = render_scene(scene, width=width, height=height, seed=seed * 1_000_003 + i)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=quality)
        out.append(SyntheticSample(f"{seed:03d}{i:06d}", describe(scene, rng), {"source": "scenes"}, buf.getvalue()))
    return out


def train_wordpiece(texts: Iterable[str], out_dir: str | Path, vocab_size: int = 400) -> Path:
    """A small lowercase WordPiece vocabulary (BERT special tokens) for ``texts``; returns the
    ``vocab.txt`` path. A small vocabulary keeps tiny test models fast.

    Built here rather than by `tokenizers`' trainer, whose merges vary from one process to the
    next (its hash maps are seeded at random, so ties between pair counts fall either way): the
    ids of the learning test's words changed with every run, and with them the model it trains.
    Here: the special tokens, every character alone and as a "##" suffix (so any word of these
    characters can be spelled), then whole words, most frequent first, ties in alphabetical
    order, up to ``vocab_size``."""
    import re
    from collections import Counter

    words = Counter(w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower()))
    chars = sorted({c for w in words for c in w})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars if c.isalnum())]
    seen = set(vocab)
    for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) >= vocab_size:
            break
        if w not in seen:
            vocab.append(w)
            seen.add(w)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return out / "vocab.txt"
