"""Issue 30, acceptance 4: img2dataset 1.47.0 (in its own environment) and lait on the same URL
list of 30 real photos and three broken rows (a 404, a page that is not an image, a port where
nothing listens) with extra columns: the same samples under the same keys, the same sidecar rows
(successes and failures, with the same statuses), the same `_stats.json` counts, the extra
columns with their types in both. Skips when img2dataset's environment cannot be made.

Issue 52: the same with the list as CSV and as TSV text, where both tools type the integer and
float columns (img2dataset reads such lists with pyarrow's CSV reader)."""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from kit.photos import MISSING_PREFIX, NOT_AN_IMAGE_PREFIX, PhotoServer, PhotoSite, coco_photos

pytestmark = pytest.mark.slow  # two downloads and lait's stages 2-5: about a minute

EXTRA = ["id", "weight", "tag"]
PIPELINE = ("filter: {unsafe_model: none}\n"  # stage 2's model gates: not what this test is about
            "clean: {languages: [en]}\nscore: {model: demo, near_dup_threshold: 0.999}\n"
            "build: {key_order: input, face_model: none}\n")


def closed_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def read_shards(folder: Path) -> tuple[dict[str, dict], dict[str, dict], dict[str, dict]]:
    """(key -> sample JSON, key -> sidecar row, shard -> _stats.json) of a WebDataset folder."""
    samples = {}
    for t in sorted(folder.glob("*.tar")):
        with tarfile.open(t) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".json"):
                    samples[m.name[:-5]] = json.load(io.TextIOWrapper(tf.extractfile(m)))
    sidecar = {r["key"]: r for p in sorted(folder.glob("*.parquet")) for r in pq.read_table(p).to_pylist()}
    stats = {p.name[:5]: json.loads(p.read_text()) for p in folder.glob("*_stats.json")}
    return samples, sidecar, stats


def write_list(rows: list[dict], path: Path) -> None:
    """The rows as a Parquet list (typed columns), or as CSV or TSV text (by the suffix)."""
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
        return
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t" if path.suffix == ".tsv" else ",")
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture(params=["parquet", "csv", "tsv"])
def photo_list(shared_data, tmp_path, request):
    """The list (Parquet with typed extra columns, or the same rows as CSV or TSV text, whose
    integer and float columns both tools must type) and its rows; its photos served from two
    hosts."""
    coco = [(p, c) for p, c in coco_photos(shared_data / "photos" / "coco_train")
            if min(Image.open(p).size) >= 300][:30]  # every one passes stage 2's 300 px rule
    assert len(coco) == 30
    servers = [PhotoServer(PhotoSite({f"/coco/{p.name}": p.read_bytes() for p, _ in coco[h::2]}),
                           host=f"127.0.23.{h + 1}").start() for h in range(2)]
    rows = [{"url": f"{servers[i % 2].url}/coco/{p.name}", "caption": c} for i, (p, c) in enumerate(coco)]
    broken = [{"url": f"{servers[0].url}{MISSING_PREFIX}gone.jpg", "caption": "A photo that is gone now."},
              {"url": f"{servers[1].url}{NOT_AN_IMAGE_PREFIX}login.jpg", "caption": "A login page, not a photo."},
              {"url": f"http://127.0.23.9:{closed_port('127.0.23.9')}/a.jpg", "caption": "Nothing listens here."}]
    for at, row in zip((4, 15, 27), broken):
        rows.insert(at, row)
    for i, r in enumerate(rows):
        r.update(id=1000 + i, weight=i / 8, tag=f"row-{i}")
    listing = tmp_path / f"photos.{request.param}"
    write_list(rows, listing)
    yield listing, rows
    for s in servers:
        s.close()


def run_img2dataset(python: str, listing: Path, out: Path) -> None:
    cmd = [str(Path(python).parent / "img2dataset"), "--url_list", str(listing), "--input_format", listing.suffix[1:],
           "--url_col", "url", "--caption_col", "caption", "--save_additional_columns", json.dumps(EXTRA),
           "--output_format", "webdataset", "--output_folder", str(out), "--processes_count", "1",
           "--thread_count", "8", "--resize_mode", "no", "--skip_reencode", "True", "--distributor",
           "multiprocessing", "--enable_wandb", "False", "--timeout", "10", "--retries", "0"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # TMPDIR: img2dataset's worker processes import wandb, which makes tmp*wandb-* folders that a
    # worker's exit leaves behind: in the test's folder, not in /tmp.
    tmp = out.parent / f"{out.name}-tmp"
    tmp.mkdir(exist_ok=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=dict(env, NO_ALBUMENTATIONS_UPDATE="1", TMPDIR=str(tmp)))
    assert done.returncode == 0, done.stderr[-3000:]


def run_lait(listing: Path, work: Path, tmp_path: Path) -> None:
    def lait(*argv: str) -> None:
        done = subprocess.run([sys.executable, "-m", "lait", *argv], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]

    lait("download", str(listing), "--out", str(work), "--allow-loopback", "--no-autothrottle",
         "--save-additional-columns", *EXTRA, "--download-timeout", "10", "--retries", "0", "--processes", "1",
         "--log-level", "WARNING", "--no-progress")
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    lait("run", str(work), "--config", str(tmp_path / "pipeline.yaml"), "--workers", "1", "--no-progress")


def test_lait_keeps_img2datasets_books(img2dataset_python, photo_list, tmp_path):
    listing, rows = photo_list
    run_img2dataset(img2dataset_python, listing, tmp_path / "i2d")
    run_lait(listing, tmp_path / "W", tmp_path)
    theirs, ours = read_shards(tmp_path / "i2d"), read_shards(tmp_path / "W" / "shards")
    (t_samples, t_side, t_stats), (o_samples, o_side, o_stats) = theirs, ours

    # the same samples under the same keys: key N is list row N, and both tools say so
    assert len(t_samples) == 30
    assert {k: s["url"] for k, s in o_samples.items()} == {k: s["url"] for k, s in t_samples.items()}
    assert all(rows[int(k)]["url"] == s["url"] for k, s in o_samples.items())
    # the same sidecar rows, successes and failures, with the same statuses
    assert len(t_side) == len(rows) == 33
    assert {k: (r["url"], r["status"]) for k, r in o_side.items()} == \
        {k: (r["url"], r["status"]) for k, r in t_side.items()}
    failed = {k: r for k, r in o_side.items() if r["status"] != "success"}
    assert {k: (r["status"], r["reason"]) for k, r in failed.items()} == {
        "000000004": ("failed_to_download", "filter/status"),
        "000000015": ("failed_to_resize", "filter/not_image"),
        "000000027": ("failed_to_download", "crawl/host_unreachable")}
    assert all(r["error_message"] for r in failed.values())
    # one rejected/ row per broken input, none from stage 3 for images never fetched
    from lait.workdir import WorkDir

    broken = {rows[int(k)]["url"] for k in failed}
    assert sorted(r["reason"] for r in WorkDir(tmp_path / "W").iter_rows("rejected") if r["image_url"] in broken) \
        == ["crawl/host_unreachable", "filter/not_image", "filter/status"]
    # the same _stats.json counts
    counts = ("count", "successes", "failed_to_download", "failed_to_resize")
    assert {s: {c: v[c] for c in counts} for s, v in o_stats.items()} == \
        {s: {c: v[c] for c in counts} for s, v in t_stats.items()}
    # the extra columns, with the list's types, in every sample and sidecar row of both
    for samples, side in ((t_samples, t_side), (o_samples, o_side)):
        for k, s in samples.items():  # with their JSON types: 1.0 is not 1 here
            assert {c: (type(s[c]), s[c]) for c in EXTRA} == {c: (type(rows[int(k)][c]), rows[int(k)][c]) for c in EXTRA}
        for k, r in side.items():
            assert {c: r[c] for c in EXTRA} == {c: rows[int(k)][c] for c in EXTRA}
    for folder in (tmp_path / "i2d", tmp_path / "W" / "shards"):
        schema = pq.read_schema(folder / "00000.parquet")
        assert [schema.field(c).type for c in EXTRA] == [pa.int64(), pa.float64(), pa.string()]
