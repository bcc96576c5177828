"""Shared test helpers: a tiny open_clip config and small work directories written directly."""

from __future__ import annotations

import hashlib
import io
import json
import random
from datetime import datetime, timezone
from pathlib import Path

from PIL import Image

from lait.workdir import WorkDir, partition_of

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)

TINY_CFG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 16, "head_width": 32},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


def tiny_config_file(tmp: Path, name: str = "lait-test-tiny") -> Path:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(TINY_CFG))
    return path


def jpeg(seed: int, size: tuple[int, int] = (120, 96)) -> bytes:
    rng = random.Random(seed)
    img = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
    px = img.load()
    for _ in range(200):
        px[rng.randrange(size[0]), rng.randrange(size[1])] = tuple(rng.randrange(256) for _ in range(3))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def write_work(root: Path, images: dict[str, bytes], candidates: list[tuple[str, str, list[tuple[str, str]]]],
               n_partitions: int = 4) -> WorkDir:
    """A work directory with `images_ok/` and `candidates/` parts, partitioned by image URL."""
    work = WorkDir(root, n_partitions=n_partitions).init()
    writers: dict[tuple[str, int], object] = {}

    def w(table: str, p: int):
        if (table, p) not in writers:
            writers[(table, p)] = work.writer(table, p, "test")
        return writers[(table, p)]

    for url, data in images.items():
        w("images_ok", partition_of(url, n_partitions)).write({
            "image_url": url, "page_url": "http://site/p", "bytes": data, "mime": "image/jpeg",
            "status": 200, "fetched_at": T0, "width": 120, "height": 96, "format": "JPEG",
            "sha256": hashlib.sha256(data).hexdigest(), "phash": "0" * 16})
    for page, url, texts in candidates:
        w("candidates", partition_of(url, n_partitions)).write({
            "page_url": page, "image_url": url,
            "texts": [{"text": t, "source": s, "lang": "en"} for t, s in texts]})
    for writer in writers.values():
        writer.close()
    return work
