"""Stage 5 aggregation on a work directory written directly (tests/build/build_data.py)."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from kit import build_data as data  # noqa: E402
from lait.build.config import BuildConfig
from lait.build.pipeline import build
from lait.config import ConfigError
from lait.workdir import WorkDir


def read_shards(root: Path) -> dict[str, dict[str, bytes]]:
    """Every sample of every tar, by key."""
    samples: dict[str, dict[str, bytes]] = {}
    for tar in sorted((root / "shards").glob("*.tar")):
        with tarfile.open(tar) as tf:
            for m in tf.getmembers():
                key, ext = m.name.split(".", 1)
                samples.setdefault(key, {})[ext] = tf.extractfile(m).read()
    return samples


def rejects(work: WorkDir) -> dict[str, str]:
    """image URL -> reason, for the build's rejects."""
    t = work.read("rejected").to_pylist()
    return {r["image_url"]: r["reason"] for r in t if r["reason"].startswith("build/")}


def run(root: Path, **kw) -> object:
    cfg = BuildConfig(work=str(root), workers=kw.pop("workers", 1), progress=False,
                      samples_per_shard=kw.pop("samples_per_shard", 16), **kw)
    cfg.validate()
    result = build(cfg)
    assert result.ok, result.summary()
    return result


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("work")
    work, expect = data.make_work(root)
    result = run(root)
    return root, work, expect, result


def test_every_image_gets_its_expected_caption_or_reason(built):
    root, work, expect, _ = built
    samples = read_shards(root)
    by_url = {json.loads(s["json"])["url"]: s for s in samples.values()}
    dropped = rejects(work)
    for url, want in expect.items():
        if want.startswith("build/"):
            assert url not in by_url, url
            assert dropped.get(url) == want, (url, dropped.get(url))
        else:
            assert by_url[url]["txt"].decode() == want, url
            assert url not in dropped
    assert len(samples) == sum(1 for w in expect.values() if not w.startswith("build/"))


def test_sample_json_has_scores_candidates_and_duplicate_urls(built):
    root, *_ = built
    metas = {json.loads(s["json"])["url"]: json.loads(s["json"]) for s in read_shards(root).values()}
    m3 = metas[f"{data.SITE}/img/photo3.jpg"]
    assert m3["caption"] == "the best caption of grid three" and m3["score"] == pytest.approx(0.5)
    assert m3["urls"] == [f"{data.SITE}/img/photo3.jpg", f"{data.SITE}/img/copy3.jpg"] and m3["n_duplicates"] == 1
    assert m3["candidates"][0]["text"] == m3["caption"]
    assert m3["candidates"][1]["text"] == data.caption(3)  # the next best, from the other copy
    assert [c["score"] for c in m3["candidates"]] == sorted((c["score"] for c in m3["candidates"]), reverse=True)
    m7 = metas[f"{data.SITE}/img/photo7.jpg"]
    assert m7["source"] == "figcaption" and m7["candidates"][1]["text"] == "grid seven"  # tie: source order
    assert all(c["text"] != data.GENERIC for m in metas.values() for c in m["candidates"])
    assert metas[f"{data.SITE}/img/photo5.jpg"]["width"] == 400  # the larger copy is the sample
    assert metas[f"{data.SITE}/img/photo1.jpg"]["urls"] == [f"{data.SITE}/img/photo1.jpg"]


def test_every_tar_image_decodes_as_jpeg_and_sidecars_match(built):
    root, *_ = built
    samples = read_shards(root)
    for s in samples.values():
        assert set(s) == {"jpg", "txt", "json"}
        with Image.open(io.BytesIO(s["jpg"])) as im:
            assert im.format == "JPEG"
    sizes = json.loads((root / "shards" / "sizes.json").read_text())
    assert sum(sizes.values()) == len(samples)
    side = pq.read_table(sorted((root / "shards").glob("*.parquet"))).to_pylist()
    ok = {r["key"]: r for r in side if r["status"] == "success"}
    assert set(ok) == set(samples)
    assert [r for r in side if r["status"] != "success"][0]["url"].endswith("broken.png")
    for key, r in ok.items():
        assert r["caption"] == samples[key]["txt"].decode()
    stats = json.loads((root / "shards" / "stats.json").read_text())
    assert stats["samples"] == len(samples) and stats["counters"]["build/duplicate_sha256"] == 1


def test_min_score_and_top_fraction(tmp_path):
    work, expect = data.make_work(tmp_path)
    result = run(tmp_path, min_score=0.1, top_fraction=0.5)
    dropped = rejects(work)
    assert dropped[f"{data.SITE}/img/weak.jpg"] == "build/min_score"
    # 40 photos, the PNG and the broken PNG pass min_score: half of 42 is kept.
    assert result.stats["counters"]["build/planned"] == 21
    cut = [r for r in work.read("rejected").to_pylist() if r["reason"] == "build/top_fraction"]
    assert len(cut) == 21
    kept = [json.loads(s["json"])["score"] for s in read_shards(tmp_path).values()]
    assert max(float(r["detail"].split()[0]) for r in cut) <= min(kept)


def test_output_does_not_depend_on_workers_and_is_reproducible(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    data.make_work(a, n_partitions=4)
    data.make_work(b, n_partitions=4)
    run(a, workers=1, samples_per_shard=8)
    run(b, workers=2, samples_per_shard=8)
    files = sorted(p.name for p in (a / "shards").iterdir())
    assert files == sorted(p.name for p in (b / "shards").iterdir())
    assert len([f for f in files if f.endswith(".tar")]) > 2
    for name in files:
        if name.endswith((".tar", ".parquet")) or name == "sizes.json":
            assert (a / "shards" / name).read_bytes() == (b / "shards" / name).read_bytes(), name


def test_plan_in_a_child_process_writes_the_same_plan(tmp_path, monkeypatch):
    """Large builds plan in a forked child (its heap goes back to the system when it exits),
    small ones in the process itself: both write the same plan, rejects and shards."""
    from lait.build import pipeline

    calls = []
    real = pipeline.plan_in_child
    monkeypatch.setattr(pipeline, "plan_in_child", lambda cfg: calls.append(1) or real(cfg))
    a, b = tmp_path / "a", tmp_path / "b"
    data.make_work(a, n_partitions=4)
    data.make_work(b, n_partitions=4)
    run(a, samples_per_shard=8)
    assert calls == []  # a few images: planned here
    monkeypatch.setattr(pipeline, "PLAN_IN_PROCESS_IMAGES", 0)
    run(b, samples_per_shard=8)
    assert calls == [1]
    wa, wb = WorkDir(a), WorkDir(b)
    for table in ("build_plan", "pool", "rejected"):
        assert wa.read(table).equals(wb.read(table)), table
    for name in sorted(p.name for p in (a / "shards").iterdir()):
        if name.endswith((".tar", ".parquet")):
            assert (a / "shards" / name).read_bytes() == (b / "shards" / name).read_bytes(), name


def test_rerun_reuses_and_changed_settings_rebuild(tmp_path):
    data.make_work(tmp_path)
    run(tmp_path)
    tar = tmp_path / "shards" / "00000.tar"
    first = tar.stat().st_mtime_ns
    again = run(tmp_path)
    assert again.reused and tar.stat().st_mtime_ns == first
    changed = run(tmp_path, samples_per_shard=100)
    assert not changed.reused
    assert [p.name for p in sorted((tmp_path / "shards").glob("*.tar"))] == ["00000.tar"]
    # The rejects of the first build were replaced, not added to.
    reasons = [r["reason"] for r in WorkDir(tmp_path).read("rejected").to_pylist()]
    assert reasons.count("build/duplicate_sha256") == 1


def test_interrupted_shard_is_redone(tmp_path):
    data.make_work(tmp_path)
    run(tmp_path)
    work = WorkDir(tmp_path)
    want = (tmp_path / "shards" / "00001.tar").read_bytes()
    (tmp_path / "shards" / "00001.tar").write_bytes(b"half a tar")
    work.marker_path("build_shards", 1).unlink()
    assert not run(tmp_path).reused
    assert (tmp_path / "shards" / "00001.tar").read_bytes() == want


def test_missing_inputs_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="lait.json"):
        build(BuildConfig(work=str(tmp_path)))
    WorkDir(tmp_path, n_partitions=2).init()
    with pytest.raises(ConfigError, match="scored"):
        build(BuildConfig(work=str(tmp_path)))
    with pytest.raises(ConfigError, match="top_fraction"):
        BuildConfig(work="w", top_fraction=0).validate()


def test_tar_writer_matches_tarfile_byte_for_byte(tmp_path):
    from lait.build.shards import TarShardWriter

    members = [("000000001.jpg", b"x" * 1000), ("000000001.txt", "héllo".encode()), ("000000001.json", b"{}"),
               ("000000002.jpg", b""), ("000000002.txt", b"a" * 512)]
    w = TarShardWriter(tmp_path / "a.tar")
    w.write("000000001", {"jpg": members[0][1], "txt": members[1][1], "json": members[2][1]})
    w.write("000000002", {"jpg": members[3][1], "txt": members[4][1]})
    w.close()
    assert (tmp_path / "a.tar").read_bytes() == _tarfile_bytes(members)


def _tarfile_bytes(members: list[tuple[str, bytes]]) -> bytes:
    from lait.build.shards import MTIME

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(payload), MTIME, 0o444
            tf.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def _many_samples(n: int) -> list[tuple[str, dict[str, bytes]]]:
    rng = np.random.default_rng(0)
    return [(f"{i:09d}", {"jpg": rng.bytes(int(rng.integers(0, 5000))), "txt": f"caption {i}".encode()})
            for i in range(n)]


def _members(samples):
    return [(f"{key}.{ext}", data) for key, sample in samples for ext, data in sample.items()]


def test_tar_writer_batches_and_writeback_keep_the_bytes(tmp_path, monkeypatch):
    """Many samples through small batches, a short queue and early writeback: still tarfile's bytes."""
    from lait.build.shards import TarShardWriter

    monkeypatch.setattr(TarShardWriter, "BATCH_BYTES", 7000)
    monkeypatch.setattr(TarShardWriter, "BATCH_CHUNKS", 5)
    monkeypatch.setattr(TarShardWriter, "WRITEBACK_BYTES", 20_000)
    monkeypatch.setattr(TarShardWriter, "QUEUE", 1)
    samples = _many_samples(300)
    w = TarShardWriter(tmp_path / "a.tar")
    for key, sample in samples:
        w.write(key, {ext: memoryview(data) for ext, data in sample.items()})  # views, as the shard pass passes
    w.close()
    assert (tmp_path / "a.tar").read_bytes() == _tarfile_bytes(_members(samples))
    assert w.samples == 300 and w.bytes == sum(len(d) for _, d in _members(samples))
    assert [p.name for p in tmp_path.iterdir()] == ["a.tar"]  # no temporary file left


def test_tar_writer_finishes_short_writes(tmp_path, monkeypatch):
    """`writev` may write less than asked (a signal, a nearly full disk): the rest still goes out."""
    from lait.build import shards

    real = os.writev

    def short(fd, chunks):
        return real(fd, chunks[:1]) if len(chunks) > 1 else real(fd, chunks)

    monkeypatch.setattr(shards.os, "writev", short)
    samples = _many_samples(40)
    w = shards.TarShardWriter(tmp_path / "a.tar")
    for key, sample in samples:
        w.write(key, sample)
    w.close()
    assert (tmp_path / "a.tar").read_bytes() == _tarfile_bytes(_members(samples))


def test_tar_writer_error_surfaces_and_leaves_no_file(tmp_path, monkeypatch):
    """A write that fails in the writer thread (disk full) is raised to the shard pass; the
    tar never appears, and no temporary file is left behind."""
    import errno

    from lait.build import shards

    def full(fd, chunks):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shards.os, "writev", full)
    from lait.errors import OutOfSpace

    w = shards.TarShardWriter(tmp_path / "a.tar")
    with pytest.raises(OutOfSpace, match=r"a\.tar: no space left on device"):
        for key, sample in _many_samples(50):
            w.write(key, sample)
        w.close()
    w.abort()
    assert list(tmp_path.iterdir()) == []
