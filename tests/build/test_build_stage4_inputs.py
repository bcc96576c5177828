"""Stage 4's optional tables in stage 5: embedding near-duplicate pairs and region arrays."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from lait.build.config import BuildConfig
from lait.build.pipeline import build
from lait.parts import PartitionedWriter
from lait.workdir import WorkDir

tables = pytest.importorskip("lait.arrays")

from kit import build_data as data  # noqa: E402


def _write(work: WorkDir, table: str, rows: list[dict], key: str) -> None:
    with PartitionedWriter(work, "score-test") as parts:  # one part per partition of `key`
        for r in rows:
            parts.write(table, parts.partition_of(r[key]), r)


def _members(root: Path) -> dict[str, bytes]:
    out = {}
    for tar in sorted((root / "shards").glob("*.tar")):
        with tarfile.open(tar) as tf:
            out.update({m.name: tf.extractfile(m).read() for m in tf.getmembers()})
    return out


def test_embedding_pairs_without_pixel_agreement_stay_apart_and_regions_go_into_shards(tmp_path):
    work, _ = data.make_work(tmp_path)
    a, b = f"{data.SITE}/img/photo10.jpg", f"{data.SITE}/img/photo11.jpg"  # distinct hashes
    _write(work, "near_dups", [{"image_url_a": a, "image_url_b": b, "cosine": 0.97}], "image_url_a")
    rng = np.random.default_rng(0)
    regions, labels = [], []
    for i in (0, 1, 2):
        url, n = f"{data.SITE}/img/photo{i}.jpg", 3 + i
        feats = rng.standard_normal((n, 8)).astype(np.float16)
        boxes = np.tile(np.array([0.1, 0.2, 0.5, 0.9], np.float32), (n, 1))
        regions.append({"image_url": url, "n": n, "dim": 8, "features": tables.to_bytes(feats, "<f2"),
                        "boxes": tables.to_bytes(boxes, "<f4")})
        if i < 2:  # photo2 has features but no labels yet
            labels.append({"image_url": url, "n": n, "labels": tables.to_bytes(np.arange(n), "<i4")})
    _write(work, "regions", regions, "image_url")
    _write(work, "region_labels", labels, "image_url")

    assert build(BuildConfig(work=str(tmp_path), workers=1, progress=False, samples_per_shard=16)).ok
    dropped = {r["image_url"]: r for r in work.read("rejected").to_pylist() if r["reason"].startswith("build/")}
    # Two distinct pictures that the embeddings put together: the pixel check (phash) refuses
    # the merge, so both stay samples with their own captions (test_build_neardup has the rest).
    assert a not in dropped and b not in dropped
    members = _members(tmp_path)
    by_url = {json.loads(v)["url"]: k.split(".")[0] for k, v in members.items() if k.endswith(".json")}
    assert a in by_url and b in by_url
    for i in (0, 1, 2):
        key, n = by_url[f"{data.SITE}/img/photo{i}.jpg"], 3 + i
        feats = np.load(io.BytesIO(members[f"{key}.regions.npy"]), allow_pickle=False)
        boxes = np.load(io.BytesIO(members[f"{key}.boxes.npy"]), allow_pickle=False)
        assert feats.dtype == np.float16 and feats.shape == (n, 8)
        assert boxes.shape == (n, 4) and np.allclose(boxes[0], [0.1, 0.2, 0.5, 0.9])
        if i < 2:
            assert np.load(io.BytesIO(members[f"{key}.labels.npy"]), allow_pickle=False).tolist() == list(range(n))
        else:
            assert f"{key}.labels.npy" not in members
    key3 = by_url[f"{data.SITE}/img/photo3.jpg"]
    assert f"{key3}.regions.npy" not in members
