"""The shards of `lait demo` and of the real-web mode, read by the real readers, in lait's own
environment: Hugging Face `datasets`, open_clip_train's `get_wds_dataset`, webdataset; resized
shards against img2dataset's own resizer; then a DataComp-style selection round trip and
clip-retrieval's embedding layout into faiss.

The readers are imported, not skipped when missing: the dev extras install them beside lait
(`datasets`, `open_clip_torch[training]` with the webdataset it pins, `faiss-cpu`), and a
reader that does not install there is what this file exists to catch. img2dataset lives in an
environment of its own (tests/build/conftest.py).

Slow: each work directory comes from a crawl of a local web and stages 2-5 with the offline
demo scorer (the demo: 40 articles; the real web: the first 60 pages of ../shared/data/html,
with their photos).
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import datasets
import faiss
import numpy as np
import open_clip
import open_clip_train.data
import pyarrow.parquet as pq
import pytest
import webdataset as wds
import yaml
from PIL import Image

pytest.importorskip("lait.crawler.run")
pytest.importorskip("lait.scoring.pipeline")

from lait.build.config import SelectConfig  # noqa: E402
from lait.build.export import ExportConfig, export_embeddings  # noqa: E402
from lait.build.sample import array_to_uids, check_sample  # noqa: E402
from lait.build.select import select  # noqa: E402
from lait.workdir import WorkDir  # noqa: E402

# One xdist worker runs the whole module, beside test_build_demo_e2e: its tests reach the
# session's 40-page demo and the module's real-web run through `request.getfixturevalue`,
# which tests/conftest.py's grouping by fixtures cannot see.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("demo40")]


@pytest.fixture(scope="module")
def demo(demo40) -> Path:
    """The session's 40-page demo with its defaults (tests/build/conftest.py): read only here."""
    return demo40[0] / "work"


@pytest.fixture(scope="module")
def realweb(tmp_path_factory, shared_data) -> Path:
    from lait.crawler.config import CrawlConfig
    from lait.crawler.run import crawl
    from lait.testkit.realweb import RealWebSite
    from lait.testkit.server import SiteServer

    work = tmp_path_factory.mktemp("realweb") / "work"
    site = RealWebSite(shared_data, max_pages=60)
    site.ground_truth()  # builds every page now: built on the first request, they outlast its timeout
    # Every page is one hop from the index: max_depth 1 leaves out the real pages' own links,
    # thousands of them, all answered 404 (no image, no sample).
    with SiteServer(site, port=0) as srv:
        stats = crawl(CrawlConfig(seeds=[srv.url + "/"], out=str(work), allow_loopback=True, autothrottle=False,
                                  concurrency=16, per_domain=16, log_level="WARNING", max_depth=1), quiet=True)
    assert stats.get("finish_reason") == "finished", stats.get("finish_reason")
    # Stages 2-5 in a process of their own: workers forked from this process while one of the
    # server's handler threads held lxml's lock would wait for it forever.
    pipeline = work.parent / "pipeline.yaml"
    pipeline.write_text(yaml.safe_dump({"score": {"model": "demo", "near_dup_threshold": 0.999},
                                        "build": {"samples_per_shard": 100}}))
    res = subprocess.run([sys.executable, "-m", "lait", "run", str(work), "--config", str(pipeline), "--workers", "2",
                          "--no-progress"], capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    return work


@pytest.fixture(params=["demo", "realweb"])
def work(request) -> Path:
    return request.getfixturevalue(request.param)


def tars(folder: Path) -> list[str]:
    return [str(p) for p in sorted(folder.glob("*.tar"))]


def tar_samples(folder: Path) -> dict[str, dict]:
    """key -> KEY.json, counted straight from the tars."""
    out = {}
    for t in tars(folder):
        with tarfile.open(t) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".json"):
                    out[m.name.split(".", 1)[0]] = json.loads(tf.extractfile(m).read())
    return out


def test_huggingface_datasets_loads_every_shard(work, tmp_path):
    """`load_dataset(FOLDER)`, as a user loads the folder or a Hub repository of it: the card's
    features, the tars only (not the sidecars), every sample with its own JSON."""
    shards = work / "shards"
    ds = datasets.load_dataset(str(shards), split="train", cache_dir=str(tmp_path / "hf"))
    samples = tar_samples(shards)
    assert len(ds) == len(samples) == sum(json.loads((shards / "sizes.json").read_text()).values()) > 50
    assert sorted(ds["__key__"]) == sorted(samples)
    assert {r["uid"] for r in ds["json"]} == {m["uid"] for m in samples.values()}
    by_key = dict(zip(ds["__key__"], ds["json"]))
    assert all(by_key[k]["face_bboxes"] == m["face_bboxes"] and by_key[k]["candidates"] == m["candidates"]
               for k, m in samples.items())
    assert isinstance(ds.features["jpg"], datasets.Image) and ds[0]["jpg"].size == (ds[0]["json"]["width"],
                                                                                     ds[0]["json"]["height"])


def test_huggingface_datasets_types_faces_from_the_card_whatever_the_order(realweb, tmp_path):
    """Five samples without faces first typed `face_bboxes` as a list of nulls when `datasets`
    inferred the features, and the first face failed the load (a CI run on the real-web shards).
    The folder's card types it: the same samples, those without faces first, load."""
    samples = tar_samples(realweb / "shards")
    faces = [k for k, m in samples.items() if m["face_bboxes"]]
    assert faces and len(samples) - len(faces) >= 5  # the real pages have both
    folder = tmp_path / "reordered"
    folder.mkdir()
    members: dict[str, list[tuple[tarfile.TarInfo, bytes]]] = {}
    for tar in tars(realweb / "shards"):
        with tarfile.open(tar) as tf:
            for info in tf:
                members.setdefault(info.name.split(".", 1)[0], []).append((info, tf.extractfile(info).read()))
    with tarfile.open(folder / "00000.tar", "w") as out:
        for key in sorted(samples, key=lambda k: (bool(samples[k]["face_bboxes"]), k)):
            for info, data in members[key]:
                out.addfile(info, io.BytesIO(data))
    shutil.copy(realweb / "shards" / "README.md", folder / "README.md")
    with pytest.raises(datasets.exceptions.DatasetGenerationError):  # what the card prevents
        datasets.load_dataset("webdataset", data_files={"train": [str(folder / "00000.tar")]}, split="train",
                              cache_dir=str(tmp_path / "hf-inferred"))
    ds = datasets.load_dataset(str(folder), split="train", cache_dir=str(tmp_path / "hf"))
    assert not ds[0]["json"]["face_bboxes"] and ds.features["json"]["face_bboxes"].feature.feature.dtype == "float64"
    assert {k: j["face_bboxes"] for k, j in zip(ds["__key__"], ds["json"])} == \
        {k: m["face_bboxes"] for k, m in samples.items()}


def test_the_environment_is_lait_beside_open_clip_trains_webdataset():
    """What `pip install -e '.[dev]'` made: webdataset at the version open_clip's training extra
    pins, and lait itself requiring none."""
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement

    pins = [Requirement(r) for r in requires("open_clip_torch") if r.startswith("webdataset")]
    assert pins and all(version("webdataset") in p.specifier for p in pins), (version("webdataset"), pins)
    lait_needs = [Requirement(r) for r in requires("lait")]
    assert not [r for r in lait_needs if r.name == "webdataset" and not r.marker]


def test_open_clip_train_reads_them_without_a_shim(work):
    shards = tars(work / "shards")
    args = argparse.Namespace(train_data="::".join(shards), val_data=None, train_num_samples=None,
                              dataset_resampled=False, train_data_upsampling_factors=None, seed=0,
                              batch_size=16, workers=0, world_size=1)
    _, _, preprocess = open_clip.create_model_and_transforms("ViT-B-32", pretrained=None)
    info = open_clip_train.data.get_wds_dataset(args, preprocess, is_train=True, epoch=0,
                                    tokenizer=open_clip.get_tokenizer("ViT-B-32"))
    n = len(tar_samples(work / "shards"))
    assert info.dataloader.num_samples == n + (-n) % 16  # from sizes.json
    seen = 0
    for images, texts in info.dataloader:
        assert tuple(images.shape[1:]) == (3, 224, 224) and tuple(texts.shape[1:]) == (77,)
        seen += images.shape[0]
    assert seen == info.dataloader.num_samples


def test_webdataset_reads_every_sample_in_the_schema(work):
    n = 0
    for img, txt, meta in wds.WebDataset(tars(work / "shards"), shardshuffle=False).decode("pil").to_tuple(
            "jpg", "txt", "json"):
        assert check_sample(meta) == [] and txt == meta["caption"]
        assert img.size == (meta["width"], meta["height"]) == (meta["original_width"], meta["original_height"])
        n += 1
    assert n == len(tar_samples(work / "shards"))


def test_center_crop_makes_a_plain_batched_pipeline_work(realweb, tmp_path):
    mixed = wds.WebDataset(tars(realweb / "shards"), shardshuffle=False).decode("rgb8").to_tuple("jpg").batched(16)
    with pytest.raises(ValueError):  # real photos come in many sizes: np.stack refuses them
        for _ in mixed:
            pass
    assert select(SelectConfig(work=str(realweb), out=str(tmp_path / "sq"), resize_mode="center_crop",
                               image_size=224, samples_per_shard=100, workers=2, progress=False)).ok
    n = 0
    for images, metas in wds.WebDataset(tars(tmp_path / "sq"), shardshuffle=False).decode("rgb8").to_tuple(
            "jpg", "json").batched(16):
        assert images.shape[1:] == (224, 224, 3)
        assert all(check_sample(m) == [] and (m["width"], m["height"]) == (224, 224) for m in metas)
        n += len(metas)
    assert n == len(tar_samples(realweb / "shards"))


def test_resized_shards_match_img2dataset_on_the_same_photos(work, tmp_path, img2dataset_resize):
    """A selection resized as img2dataset would (center_crop to 224, and keep_ratio to 256),
    written losslessly, against img2dataset's `Resizer` on the very bytes the crawl fetched."""
    fetched = {}
    for r in WorkDir(work).read("images_ok", columns=["image_url", "bytes"]).to_pylist():
        fetched[r["image_url"]] = r["bytes"]
    for mode, size in (("center_crop", 224), ("keep_ratio", 256)):
        out = tmp_path / mode
        assert select(SelectConfig(work=str(work), out=str(out), resize_mode=mode, image_size=size,
                                   encode_format="png", encode_quality=1, samples_per_shard=100, workers=2,
                                   progress=False, blur_faces=False)).ok  # the resize alone: faces sharp
        mine, photos = [], []
        for t in tars(out):
            for sample in wds.WebDataset(t, shardshuffle=False).to_tuple("png", "json"):
                meta = json.loads(sample[1])
                raw = fetched[meta["url"]]
                photo = tmp_path / f"{mode}-{len(photos)}.img"
                photo.write_bytes(raw)
                photos.append(photo)
                mine.append(np.asarray(Image.open(io.BytesIO(sample[0])).convert("RGB"), np.int16))
        assert len(photos) == len(tar_samples(work / "shards")) > 50
        theirs = img2dataset_resize(photos, [mode], size)
        worst = 0
        for i, m in enumerate(mine):
            other = theirs[f"{mode}/{i}"].astype(np.int16)
            assert m.shape == other.shape, (photos[i], m.shape, other.shape)
            worst = max(worst, int(np.abs(m - other).max()))
        print(f"{work.parent.name}: {mode} {size}: {len(mine)} images, max pixel difference {worst}")
        assert worst <= 1


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()}


def test_datacomp_round_trip_selects_without_scoring(work, tmp_path, monkeypatch):
    """A new threshold, then the uid file it wrote: the same samples, no model call, the work
    directory untouched."""
    from lait.scoring import model

    calls = []

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)
        return wrapper

    for name in ("encode_images", "encode_texts"):
        monkeypatch.setattr(model.ClipScorer, name, counted(name, getattr(model.ClipScorer, name)))
    for name in ("create_model", "create_model_and_transforms"):
        monkeypatch.setattr(open_clip, name, counted(name, getattr(open_clip, name)))
    before = snapshot(work)
    built = tar_samples(work / "shards")
    # Halfway between two distinct scores near the median: KEY.json's score is the float32 of
    # the pool printed as a float64, and a cut exactly at a sample's own score would compare the two.
    distinct = sorted({m["score"] for m in built.values()})
    median = (distinct[len(distinct) // 2 - 1] + distinct[len(distinct) // 2]) / 2

    first = tmp_path / "first"
    assert select(SelectConfig(work=str(work), out=str(first), min_score=median, samples_per_shard=50,
                               workers=1, progress=False)).ok
    chosen = tar_samples(first)
    assert {m["uid"] for m in chosen.values()} == {m["uid"] for m in built.values() if m["score"] >= median}
    assert sorted(array_to_uids(np.load(first / "uids.npy"))) == sorted(m["uid"] for m in chosen.values())

    again = tmp_path / "again"
    assert select(SelectConfig(work=str(work), out=str(again), uids=str(first / "uids.npy"), samples_per_shard=50,
                               workers=1, progress=False)).ok
    assert {m["uid"] for m in tar_samples(again).values()} == {m["uid"] for m in chosen.values()}
    assert [Path(p).read_bytes() for p in tars(again)] == [Path(p).read_bytes() for p in tars(first)]
    assert calls == []
    # Untouched but for its lock file, which each selection held shared while it read (issue 51).
    assert {k: v for k, v in snapshot(work).items() if k != "_lock"} == {k: v for k, v in before.items()
                                                                         if k != "_lock"}
    assert (work / "_lock").read_bytes() == b""  # released


def test_exported_embeddings_index_in_faiss(work, tmp_path):
    out = tmp_path / "embs"
    export_embeddings(ExportConfig(work=str(work), out=str(out)))
    img = np.concatenate([np.load(p) for p in sorted((out / "img_emb").glob("*.npy"))]).astype(np.float32)
    txt = np.concatenate([np.load(p) for p in sorted((out / "text_emb").glob("*.npy"))]).astype(np.float32)
    meta = [r for p in sorted((out / "metadata").glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    assert img.shape[0] == txt.shape[0] == len(meta) == len(tar_samples(work / "shards"))
    # Row i is sample i: its URL and caption, and the embeddings stage 4 stored for them.
    side = [r for p in sorted((work / "shards").glob("*.parquet"))
            for r in sorted(pq.read_table(p).to_pylist(), key=lambda r: r["key"]) if r["status"] == "success"]
    assert [(m["image_path"], m["url"], m["caption"]) for m in meta] == \
        [(r["key"], r["url"], r["caption"]) for r in side]
    # The score is their cosine (fp16 here) where the picture has one URL; a merged picture's
    # caption may have been scored against a near-duplicate copy, whose embedding differs.
    alone = [i for i, r in enumerate(side) if r["n_duplicates"] == 0]
    assert len(alone) > 0.9 * len(side)
    scores = np.array([meta[i]["score"] for i in alone])
    assert np.allclose((img[alone] * txt[alone]).sum(axis=1), scores, atol=2e-2)
    for index in (faiss.IndexFlatIP(img.shape[1]), faiss.IndexFlatL2(img.shape[1])):
        index.add(img)
        _, nearest = index.search(img, 1)
        assert nearest[:, 0].tolist() == list(range(len(meta)))
