"""The shards read back with webdataset, Hugging Face `datasets` and open_clip's training loader."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kit import build_data as data  # noqa: E402
from lait.build.config import BuildConfig
from lait.build.pipeline import build


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """Built shards and the caption each kept image URL must carry."""
    root = tmp_path_factory.mktemp("work")
    _, expect = data.make_work(root)
    result = build(BuildConfig(work=str(root), workers=1, progress=False, samples_per_shard=16))
    assert result.ok
    kept = {u: c for u, c in expect.items() if not c.startswith("build/")}
    return root / "shards", kept


def tar_list(d: Path) -> list[str]:
    return [str(p) for p in sorted(d.glob("*.tar"))]


def test_webdataset_reads_every_sample(shards):
    import webdataset as wds

    d, kept = shards
    ds = wds.WebDataset(tar_list(d), shardshuffle=False).decode("pil").to_tuple("jpg", "txt", "json")
    seen = {}
    for img, txt, meta in ds:
        assert img.size == (meta["width"], meta["height"])
        seen[meta["url"]] = txt
    assert seen == kept


def test_huggingface_datasets_webdataset_loader(shards, tmp_path):
    datasets = pytest.importorskip("datasets")
    d, kept = shards
    ds = datasets.load_dataset("webdataset", data_files={"train": tar_list(d)}, split="train",
                               cache_dir=str(tmp_path / "hf"))
    assert len(ds) == len(kept)
    assert {"jpg", "txt", "json"} <= set(ds.column_names)
    row = ds[0]
    assert row["jpg"].size[0] > 0
    meta = row["json"] if isinstance(row["json"], dict) else json.loads(row["json"])
    assert kept[meta["url"]] == row["txt"]
    assert {r["url"]: t for r, t in zip(ds["json"], ds["txt"])} == kept


def test_open_clip_training_loader(shards):
    """open_clip's own `get_wds_dataset`, as `open_clip_train.main --dataset-type webdataset` calls
    it, in lait's environment (with the webdataset open_clip_torch[training] pins), no shim."""
    pytest.importorskip("pandas")  # open_clip_train.data imports it
    data_mod = pytest.importorskip("open_clip_train.data")
    import open_clip

    d, kept = shards
    tars = tar_list(d)
    args = argparse.Namespace(
        train_data="::".join(tars), val_data=None, train_num_samples=None, dataset_resampled=False,
        train_data_upsampling_factors=None, seed=0, batch_size=4, workers=1, world_size=1,
    )
    _, _, preprocess = open_clip.create_model_and_transforms("ViT-B-32", pretrained=None)
    tokenizer = open_clip.get_tokenizer("ViT-B-32")
    info = data_mod.get_wds_dataset(args, preprocess, is_train=True, epoch=0, tokenizer=tokenizer)
    # The epoch length comes from sizes.json, as in open_clip training.
    assert info.dataloader.num_samples == len(kept) + (-len(kept)) % 4
    images, texts = next(iter(info.dataloader))
    assert tuple(images.shape) == (4, 3, 224, 224)
    assert tuple(texts.shape) == (4, 77)
