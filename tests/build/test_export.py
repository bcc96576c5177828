"""`lait export-embeddings`: clip-retrieval's layout, rows aligned, a faiss index that finds each
image itself (the stage 5 fixture with stage 4's embedding tables, tests/build/build_data.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from kit import build_data as data  # noqa: E402
from lait.app.cli import build_parser
from lait.build.config import BuildConfig, SelectConfig
from lait.build.export import ExportConfig, export_embeddings
from lait.build.pipeline import build
from lait.build.select import select
from lait.config import ConfigError


def load_export(out: Path) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """Image and text embeddings and metadata rows, file by file in name order (as autofaiss and
    clip-retrieval back read them)."""
    imgs = [np.load(p) for p in sorted((out / "img_emb").glob("img_emb_*.npy"))]
    texts = [np.load(p) for p in sorted((out / "text_emb").glob("text_emb_*.npy"))]
    meta = [r for p in sorted((out / "metadata").glob("metadata_*.parquet")) for r in pq.read_table(p).to_pylist()]
    assert [len(a) for a in imgs] == [len(a) for a in texts]
    return np.concatenate(imgs), np.concatenate(texts), meta


def check_export(out: Path, shards: Path) -> None:
    faiss = pytest.importorskip("faiss")
    img, txt, meta = load_export(out)
    assert img.dtype == np.float16 and img.shape == (len(meta), data.EMB_DIM) == txt.shape
    side = [r for p in sorted(shards.glob("*.parquet")) for r in
            sorted(pq.read_table(p).to_pylist(), key=lambda r: r["key"]) if r["status"] == "success"]
    assert [(m["image_path"], m["url"], m["caption"], m["uid"]) for m in meta] == \
           [(r["key"], r["url"], r["caption"], r["uid"]) for r in side]
    for i, m in enumerate(meta):  # row i is the sample's own image and caption
        # The test kit keys an image's vector by its images_ok digest, which is the file as
        # fetched here (kept as it came); `sha256` is the shard's bytes, re-encoded for the PNG.
        assert np.array_equal(img[i], data.image_vector(m["fetched_sha256"]))
        assert np.array_equal(txt[i], data.text_vector(m["caption"]))
    index = faiss.IndexFlatIP(img.shape[1])
    index.add(img.astype(np.float32))
    _, nearest = index.search(img.astype(np.float32), 1)
    assert nearest[:, 0].tolist() == list(range(len(meta)))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return data.make_built_work(tmp_path_factory.mktemp("work"))


def test_export_of_the_build(work, tmp_path):
    done = export_embeddings(ExportConfig(work=str(work), out=str(tmp_path / "embs")))
    assert done["samples"] == 42 and done["files"] == 3
    check_export(tmp_path / "embs", work / "shards")
    names = sorted(p.name for p in (tmp_path / "embs" / "metadata").iterdir())
    assert names == ["metadata_00000.parquet", "metadata_00001.parquet", "metadata_00002.parquet"]


def test_export_of_a_selection_from_the_command_line(work, tmp_path):
    assert select(SelectConfig(work=str(work), out=str(tmp_path / "sel"), top_fraction=0.4, workers=1,
                               progress=False, samples_per_shard=5)).ok
    args = build_parser().parse_args(["export-embeddings", str(work), "--shards", str(tmp_path / "sel"),
                                      "--out", str(tmp_path / "embs")])
    assert args.func(args) == 0
    check_export(tmp_path / "embs", tmp_path / "sel")
    # photo3's caption was found beside its copy (copy3.jpg, another partition's texts).
    _, _, meta = load_export(tmp_path / "embs")
    assert any(m["url"].endswith("photo3.jpg") for m in meta)


def test_export_needs_shards_and_embeddings(tmp_path):
    data.make_work(tmp_path / "w")
    with pytest.raises(ConfigError, match="no shards"):
        export_embeddings(ExportConfig(work=str(tmp_path / "w"), out=str(tmp_path / "e")))
    assert build(BuildConfig(work=str(tmp_path / "w"), workers=1, progress=False)).ok
    with pytest.raises(ConfigError, match="image_embs"):
        export_embeddings(ExportConfig(work=str(tmp_path / "w"), out=str(tmp_path / "e")))
