"""Issue 59, row 6: 64 bytes overwritten inside a shard's JPEG used to be decoded and trained on
silently, while the sample's .json held the SHA-256 it no longer matched. The reader now skips
such a sample and names it in one warning per shard. Other tools' samples are not checked: none
without a sha256, nor img2dataset's, whose sha256 is that of the file before it was resized."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import tarfile
from pathlib import Path

import pytest

from lait.train import data
from lait.train.data import Decoder, ShardStream, image_tensor

pytestmark = pytest.mark.timeout(300)


def scene_shards(out: Path, n: int = 12, per_shard: int = 6) -> list[Path]:
    pytest.importorskip("lait.testkit.scenes")
    from kit.synthetic_shards import scene_samples, write_shards

    return write_shards(out, scene_samples(n, seed=4, width=96, height=80), per_shard=per_shard)


def members(tar: Path) -> dict[str, bytes]:
    with tarfile.open(tar) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf if m.isfile()}


def corrupt_jpeg(tar: Path, index: int) -> str:
    """Overwrite 64 bytes in the middle of the `index`-th JPEG member, in place: the same length,
    so the tar itself stays valid (its headers are checksummed, its contents are not). Returns
    the sample's key."""
    with tarfile.open(tar) as tf:
        member = [m for m in tf if m.name.endswith(".jpg")][index]
    with open(tar, "r+b") as f:
        f.seek(member.offset_data + member.size // 2)
        block = f.read(64)
        f.seek(member.offset_data + member.size // 2)
        f.write(bytes(b ^ 0x5A for b in block))
    return member.name.removesuffix(".jpg")


def rewrite_json(tar: Path, edit) -> None:
    """Rewrite every sample's .json member through `edit(dict) -> dict` (other tools' shards)."""
    old = members(tar)
    with tarfile.open(tar, "w") as tf:
        for name, raw in old.items():
            if name.endswith(".json"):
                raw = json.dumps(edit(json.loads(raw))).encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tf.addfile(info, io.BytesIO(raw))


def read_keys(urls: list[Path]) -> list[str]:
    return [s["__key__"] for s in ShardStream([str(u) for u in urls], None, 1, 0, {}, loop=False)._raw_samples(0, 1)]


def mismatch_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("data/sha256_mismatch")]


def test_synthetic_shards_record_the_sha256_of_their_image_members(tmp_path):
    (tar, _) = scene_shards(tmp_path)
    got = members(tar)
    for name, raw in got.items():
        if name.endswith(".jpg"):
            meta = json.loads(got[name.removesuffix(".jpg") + ".json"])
            assert meta["sha256"] == meta["fetched_sha256"] == hashlib.sha256(raw).hexdigest()


def test_a_damaged_jpeg_is_skipped_with_its_key_and_the_other_samples_are_read(tmp_path, caplog):
    urls = scene_shards(tmp_path)
    every = read_keys(urls)
    bad = corrupt_jpeg(urls[0], 2)
    damaged = members(urls[0])[f"{bad}.jpg"]
    assert image_tensor(damaged, 32).shape == (3, 32, 32)  # it still decodes: nothing else would notice
    with caplog.at_level(logging.WARNING, logger="lait.train.data"):
        keys = read_keys(urls)
    assert keys == [k for k in every if k != bad]
    (line,) = mismatch_warnings(caplog)  # one line for the shard, not one per sample
    assert f"data/sha256_mismatch {urls[0]}: skipped 1 of the 6 samples read" in line
    assert line.endswith(f": {bad}")


def test_many_damaged_samples_of_a_shard_are_one_line_that_counts_them(tmp_path, caplog):
    urls = scene_shards(tmp_path, n=8, per_shard=8)
    bad = [corrupt_jpeg(urls[0], i) for i in range(7)]
    with caplog.at_level(logging.WARNING, logger="lait.train.data"):
        assert len(read_keys(urls)) == 1
    (line,) = mismatch_warnings(caplog)
    assert "skipped 7 of the 8 samples read" in line
    assert line.endswith(", ".join(bad[:5]) + " and 2 more")


@pytest.mark.parametrize("tool", ["no hashes", "img2dataset"])
def test_other_tools_samples_are_not_checked(tool, tmp_path, caplog):
    """img2dataset with --compute_hash None writes no sha256; by default it writes the sha256 of
    the file as downloaded, and the tar holds the image it resized from it: no fetched_sha256."""
    urls = scene_shards(tmp_path)
    every = read_keys(urls)
    corrupt_jpeg(urls[0], 2)
    downloaded = hashlib.sha256(b"the file before img2dataset resized it").hexdigest()
    hashes = {"no hashes": {}, "img2dataset": {"sha256": downloaded}}[tool]
    rewrite_json(urls[0], lambda meta: {**{k: v for k, v in meta.items() if "sha256" not in k}, **hashes})
    with caplog.at_level(logging.WARNING, logger="lait.train.data"):
        assert read_keys(urls) == every
    assert mismatch_warnings(caplog) == []


def test_only_sha256_is_compared_not_the_fetched_files_digest():
    matches_recorded_digest = data.matches_recorded_digest
    raw = b"\xff\xd8 image bytes as stored"
    digest = hashlib.sha256(raw).hexdigest()
    fetched = hashlib.sha256(b"the file as fetched, before it was re-encoded").hexdigest()

    def sample(ext: str, meta: dict) -> dict:
        return {"__key__": "k", ext: raw, "json": json.dumps(meta).encode()}

    assert matches_recorded_digest(sample("jpg", {"sha256": digest, "fetched_sha256": fetched}))
    assert matches_recorded_digest(sample("png", {"sha256": digest.upper(), "fetched_sha256": digest}))
    assert not matches_recorded_digest(sample("webp", {"sha256": fetched, "fetched_sha256": digest}))
    assert not matches_recorded_digest(sample("jpeg", {"sha256": fetched, "fetched_sha256": None}))
    assert matches_recorded_digest(sample("jpg", {"fetched_sha256": fetched}))  # nothing recorded to compare
    assert matches_recorded_digest(sample("jpg", {"sha256": fetched}))  # img2dataset's: of the file downloaded
    assert matches_recorded_digest({"__key__": "k", "jpg": raw, "json": b"[1, 2]"})  # not an object
    assert matches_recorded_digest({"__key__": "k", "txt": b"no image",
                                    "json": json.dumps({"sha256": fetched, "fetched_sha256": fetched})})


def test_pretraining_never_decodes_the_damaged_sample_and_decodes_the_others(
        tmp_path, pretrain_args, minilm_dir, monkeypatch, caplog):
    from lait.app.train import main

    urls = scene_shards(tmp_path / "shards")
    every = set(read_keys(urls))
    bad = corrupt_jpeg(urls[1], 4)
    decoded: set[str] = set()
    decode = Decoder.__call__

    def recording(self, sample):
        decoded.add(sample["__key__"])
        return decode(self, sample)

    monkeypatch.setattr(data.Decoder, "__call__", recording)
    model = tmp_path / "m.yaml"
    model.write_text("hidden_size: 32\nnum_layers: 1\nnum_heads: 2\nintermediate_size: 64\nmax_text_len: 64\n"
                     "region_feature_dim: 12\nnum_object_classes: 2\nembed_dim: 16\n")
    regions = ["--set", "data.regions.source=patches", "--set", "data.regions.patch_grid=[2, 4]",
               "--set", "data.regions.patch_pixels=2", "--set", "data.regions.image_size=32",
               "--set", f"model={model}", "--set", "stages.0.tasks.moc=0"]
    with caplog.at_level(logging.WARNING, logger="lait.train.data"):
        assert main(pretrain_args(tmp_path / "run", tmp_path / "shards", minilm_dir, steps=2, extra=regions)) == 0
    assert decoded == every - {bad}
    assert mismatch_warnings(caplog) and all(line.endswith(f": {bad}") for line in mismatch_warnings(caplog))
