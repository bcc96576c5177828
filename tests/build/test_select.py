"""`lait select` on the stage 5 fixture (tests/build/build_data.py): score once, select many."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from kit import build_data as data  # noqa: E402
from lait.app.cli import build_parser
from lait.build.config import BuildConfig, SelectConfig
from lait.build.pipeline import build
from lait.build.sample import array_to_uids, uids_to_array
from lait.build.select import select
from lait.config import ConfigError


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("work")
    data.make_work(root)
    assert build(BuildConfig(work=str(root), workers=1, progress=False, samples_per_shard=16)).ok
    return root


def run(work: Path, out: Path, **kw) -> dict:
    cfg = SelectConfig(work=str(work), out=str(out), workers=1, progress=False,
                       samples_per_shard=kw.pop("samples_per_shard", 16), **kw)
    cfg.validate()
    result = select(cfg)
    assert result.ok, result.summary()
    return result.stats


def tar_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.tar"))}


def metas(folder: Path) -> list[dict]:
    out = []
    for p in sorted(folder.glob("*.tar")):
        with tarfile.open(p) as tf:
            out += [json.loads(tf.extractfile(m).read()) for m in tf.getmembers() if m.name.endswith(".json")]
    return out


def test_the_builds_thresholds_select_the_builds_shards_byte_for_byte(work, tmp_path):
    stats = run(work, tmp_path / "all")
    assert tar_bytes(tmp_path / "all") == tar_bytes(work / "shards")
    assert stats["pool"] == stats["selected"] == 43  # the broken PNG is selected, and fails in its shard
    assert stats["samples"] == len(metas(work / "shards")) == 42
    for name in ("sizes.json", "uids.npy", "00000.parquet", "00000_stats.json"):
        assert (tmp_path / "all" / name).exists()


def test_top_fraction_selects_what_a_build_with_it_keeps(work, tmp_path):
    stats = run(work, tmp_path / "top", top_fraction=0.5, min_score=0.1)
    other = tmp_path / "rebuilt"
    data.make_work(other)
    assert build(BuildConfig(work=str(other), workers=1, progress=False, samples_per_shard=16,
                             top_fraction=0.5, min_score=0.1)).ok
    assert tar_bytes(tmp_path / "top") == tar_bytes(other / "shards")
    assert stats["samples"] == 21  # as tests/build/test_build_aggregate.py counts


def test_min_score_keeps_exactly_the_pool_samples_at_or_above_it(work, tmp_path):
    everything = {m["uid"]: m["score"] for m in metas(work / "shards")}
    stats = run(work, tmp_path / "high", min_score=0.33)
    chosen = {m["uid"]: m["score"] for m in metas(tmp_path / "high")}
    assert chosen and set(chosen) == {u for u, s in everything.items() if s >= 0.33}
    assert stats["selected"] == len(chosen)
    assert sorted(array_to_uids(np.load(tmp_path / "high" / "uids.npy"))) == sorted(chosen)


def test_a_uid_file_selects_the_same_samples_again(work, tmp_path):
    run(work, tmp_path / "first", top_fraction=0.3)
    run(work, tmp_path / "again", uids=str(tmp_path / "first" / "uids.npy"))
    assert tar_bytes(tmp_path / "again") == tar_bytes(tmp_path / "first")
    # A text file of hex uids, with one uid that is not in the pool.
    uids = array_to_uids(np.load(tmp_path / "first" / "uids.npy"))
    (tmp_path / "uids.txt").write_text("\n".join(uids[:3] + ["0" * 32]) + "\n")
    stats = run(work, tmp_path / "three", uids=str(tmp_path / "uids.txt"))
    assert stats["samples"] == 3 and stats["uids_not_in_pool"] == 1 and stats["uids_requested"] == 4
    assert {m["uid"] for m in metas(tmp_path / "three")} == set(uids[:3])


def test_uids_and_thresholds_intersect(work, tmp_path):
    uids = sorted(m["uid"] for m in metas(work / "shards") if m["score"] < 0.34)
    np.save(tmp_path / "subset.npy", uids_to_array(uids))
    run(work, tmp_path / "both", uids=str(tmp_path / "subset.npy"), min_score=0.32)
    got = metas(tmp_path / "both")
    assert got and all(m["uid"] in uids and m["score"] >= 0.32 for m in got)


def test_resumes_the_same_selection_and_refuses_to_mix_two(work, tmp_path):
    out = tmp_path / "sel"
    run(work, out, min_score=0.3)
    first = tar_bytes(out)
    (out / "00001.tar").unlink()
    (out / "_select" / "_done" / "build_shards" / "p00001.json").unlink()
    run(work, out, min_score=0.3)  # rewrites the missing shard only
    assert tar_bytes(out) == first
    with pytest.raises(ConfigError, match="--overwrite"):
        run(work, out, min_score=0.35)
    run(work, out, min_score=0.35, overwrite=True)
    assert min(m["score"] for m in metas(out)) >= 0.35
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        run(work, tmp_path / "busy")


def test_select_needs_a_built_pool(tmp_path):
    data.make_work(tmp_path / "w")
    with pytest.raises(ConfigError, match="lait build"):
        run(tmp_path / "w", tmp_path / "out")


def test_select_from_the_command_line(work, tmp_path):
    args = build_parser().parse_args(["select", str(work), "--out", str(tmp_path / "cli"), "--top-fraction", "0.25",
                                      "--samples-per-shard", "8", "--workers", "1", "--no-progress"])
    assert args.func(args) == 0
    sizes = json.loads((tmp_path / "cli" / "sizes.json").read_text())
    assert sum(sizes.values()) == 11 and len(sizes) == 2  # ceil(0.25 * 43 pool samples), 8 a tar
    with pytest.raises(SystemExit):
        build_parser().parse_args(["select", str(work), "--resize-mode", "stretch"])
