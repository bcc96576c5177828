"""img2dataset's bookkeeping of a build from URL lists (issue 30, fast: no fetching, no
img2dataset): every list row is a sample or a failed sidecar row with img2dataset's status,
an error message and lait's reason; the list's extra columns, typed, in samples and sidecars;
keys by input order as img2dataset forms them."""

from __future__ import annotations

import io
import json
import math
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kit import build_data as data
from lait.build.books import coerce, input_key, status_of, type_of
from lait.build.config import BuildConfig
from lait.build.pipeline import build
from lait.parts import PartitionedWriter

LIST = "/lists/photos.jsonl"
GONE = f"{data.SITE}/img/gone.jpg"  # stage 2 found a 404
NEVER = f"{data.SITE}/img/never.jpg"  # its host could not be reached


def img2dataset_key(key: int, shard_id: int, samples_per_shard: int, oom_shard_count: int = 5) -> str:
    """img2dataset 1.47.0's `compute_key` (downloader.py), written out from its source."""
    oom_sample_per_shard = math.ceil(math.log10(samples_per_shard))
    true_key = (10 ** oom_sample_per_shard) * shard_id + key
    return "{true_key:0{key_format}d}".format(key_format=oom_sample_per_shard + oom_shard_count, true_key=true_key)


def list_work(root: Path, key_order: str):
    """build_data's work directory as if `lait download` had read a list naming its images (and
    two more that stage 1 and 2 dropped, one row it refused); built. Returns (shards, rows)."""
    work, expect = data.make_work(root)
    urls = sorted(expect) + [GONE, NEVER]
    rows = [{"image_url": u, "caption": f"list caption {i}", "page_url": None, "list_file": LIST, "row": i + 1,
             "extra": json.dumps({"id": i, "weight": i / 4, "tag": f"t{i}", "nested": {"a": [i]}})}
            for i, u in enumerate(urls)]
    with PartitionedWriter(work, "list-photos") as parts:
        for r in rows:
            parts.write("url_list", parts.partition_of(r["image_url"]), r)
        parts.reject("filter/status", parts.partition_of(GONE), image_url=GONE, detail="http_404")
        parts.reject("clean/no_text", parts.partition_of(GONE), image_url=GONE, detail="no candidate text left")
        parts.reject("crawl/host_unreachable", parts.partition_of(NEVER), image_url=NEVER,
                     detail="host site.test unreachable (ConnectionRefusedError)")
        parts.reject("download/bad_url", 0, detail=f"photos.jsonl row {len(rows) + 1}: not an http(s) URL")
    marker = root / "_done" / "download" / "list-photos.json"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"path": LIST, "report": {"rows": len(rows) + 1}}))
    assert build(BuildConfig(work=str(root), workers=1, progress=False, samples_per_shard=16,
                             key_order=key_order)).ok
    return root / "shards", rows, expect


def shard_contents(shards: Path) -> tuple[dict[str, dict], list[dict], dict[str, dict]]:
    """(key -> sample JSON, sidecar rows, tar name -> _stats.json)."""
    samples = {}
    for t in sorted(shards.glob("*.tar")):
        with tarfile.open(t) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".json"):
                    samples[m.name[:-5]] = json.load(io.TextIOWrapper(tf.extractfile(m)))
    sidecar = pq.read_table(sorted(shards.glob("*.parquet"))).to_pylist()
    stats = {p.name: json.loads(p.read_text()) for p in shards.glob("*_stats.json")}
    return samples, sidecar, stats


def test_field_mapping():
    # img2dataset's statuses: no bytes had -> failed_to_download; bytes that made no sample -> resize
    assert {r: status_of(r) for r in ("crawl/host_unreachable", "filter/status", "filter/download",
                                      "download/bad_url", "build/no_image", None)} == \
        dict.fromkeys(("crawl/host_unreachable", "filter/status", "filter/download", "download/bad_url",
                       "build/no_image", None), "failed_to_download")
    assert {status_of(r) for r in ("filter/not_image", "filter/not_an_image", "filter/min_side",
                                   "build/duplicate_sha256", "build/unreadable", "clean/language")} == \
        {"failed_to_resize"}
    # img2dataset's key: shard number, then the row's index in its shard
    for position, sps in [(0, 10000), (29, 10000), (10000, 10000), (123456, 10000), (7, 16), (33, 16), (5, 1)]:
        shard, key = input_key(position, sps)
        assert (shard, key) == (position // sps, img2dataset_key(position % sps, position // sps, sps))
    assert input_key(32, 10000) == (0, "000000032")
    # one type per extra column: JSON and Parquet types kept, a mixed column as text
    assert [type_of(v) for v in ([1, None, 2], [1, 2.5], [True, None], ["a", None], [None], [1, "a"], [[1]])] == \
        ["int64", "double", "bool", "string", "string", "string", "string"]
    assert (coerce(1, "double"), coerce({"a": [1]}, "string"), coerce(None, "int64")) == (1.0, '{"a": [1]}', None)


def test_input_order_every_row_a_sample_or_a_failure(tmp_path):
    shards, rows, expect = list_work(tmp_path / "w", "input")
    samples, sidecar, stats = shard_contents(shards)
    by_key = {r["key"]: r for r in sidecar}
    n = len(rows) + 1  # the list rows read and the one refused
    assert len(by_key) == len(sidecar) == n
    for r in rows:
        shard, key = input_key(r["row"] - 1, 16)
        got = by_key[key]
        assert got["url"] == r["image_url"]
        want = expect.get(r["image_url"], "")
        if got["status"] == "success":
            assert samples[key]["url"] == r["image_url"] and not want.startswith("build/")
            assert (samples[key]["id"], samples[key]["weight"], samples[key]["tag"]) == \
                (r["row"] - 1, (r["row"] - 1) / 4, f"t{r['row'] - 1}")
            assert samples[key]["nested"] == '{"a": [' + str(r["row"] - 1) + ']}'  # nested: as JSON text
            assert got["reason"] is None and got["error_message"] is None
        else:
            assert key not in samples and got["error_message"] and got["id"] == r["row"] - 1
            if want.startswith("build/"):
                assert got["reason"] == want
    gone, never, bad = (by_key[input_key(p, 16)[1]] for p in (n - 3, n - 2, n - 1))
    assert (gone["status"], gone["reason"]) == ("failed_to_download", "filter/status")  # not stage 3's no_text
    assert (never["status"], never["reason"]) == ("failed_to_download", "crawl/host_unreachable")
    assert (bad["status"], bad["reason"], bad["url"]) == ("failed_to_download", "download/bad_url", "")
    # a sample's key is its row's position; shard N holds rows 16N..16N+15 (img2dataset's layout)
    assert sorted(p.name for p in shards.glob("*.tar")) == [f"{s:05d}.tar" for s in range(math.ceil(n / 16))]
    for name, s in stats.items():
        mine = [r for r in sidecar if r["key"].startswith(name[:5])]
        assert s["count"] == len(mine) and s["successes"] == sum(r["status"] == "success" for r in mine)
        assert s["count"] == s["successes"] + s["failed_to_download"] + s["failed_to_resize"]
    schema = pq.read_schema(shards / "00000.parquet")
    assert [(n, schema.field(n).type) for n in ("reason", "id", "weight", "tag", "nested")] == \
        [("reason", pa.string()), ("id", pa.int64()), ("weight", pa.float64()), ("tag", pa.string()),
         ("nested", pa.string())]
    assert json.loads((shards / "sizes.json").read_text()) == {
        n.replace("_stats.json", ".tar"): s["successes"] for n, s in stats.items()}
    counters = json.loads((shards / "stats.json").read_text())["counters"]
    assert (counters["build/list_rows"], counters["build/list_rows_failed"]) == \
        (n, sum(r["status"] != "success" for r in sidecar) - 1)  # broken.png failed later, in its shard


def test_build_order_lists_the_failures_too(tmp_path):
    shards, rows, _ = list_work(tmp_path / "w", "build")
    samples, sidecar, stats = shard_contents(shards)
    assert sorted(r["url"] for r in sidecar) == sorted([r["image_url"] for r in rows] + [""])
    assert len({r["key"] for r in sidecar}) == len(sidecar)  # failures keyed after their shard's samples
    assert {r["key"] for r in sidecar if r["status"] == "success"} == set(samples)
    assert sum(s["count"] for s in stats.values()) == len(rows) + 1
    assert all(isinstance(s["id"], int) for s in samples.values())


def test_download_refuses_extra_columns_named_like_sample_fields():
    from lait.app.download import DownloadConfig
    from lait.config import ConfigError

    DownloadConfig(lists=["l.csv"], out="w", save_additional_columns=["similarity", "NSFW"]).validate()
    for name in ("status", "key", "reason"):
        with pytest.raises(ConfigError, match=f"--save-additional-columns {name}: named like fields"):
            DownloadConfig(lists=["l.csv"], out="w", save_additional_columns=["id", name]).validate()
