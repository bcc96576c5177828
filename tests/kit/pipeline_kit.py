"""Helpers of the tests that run stages 2-5 end to end on a small crawl: the tiny random-init
CLIP config, the four stage commands, and the tables and shard members to compare runs by."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from lait import storage
from lait.workdir import WorkDir

TINY_CLIP = {"embed_dim": 32, "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 16,
                                            "head_width": 32},
             "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2}}
TABLES = ("pages", "images", "images_ok", "candidates", "scored", "rejected", "image_embs", "near_dups",
          "regions", "region_labels", "build_images", "build_plan")


# The model gates off: stage 2's unsafe-image classifier (open_nsfw) and stage 5's face search
# (MTCNN) cost most of a run that takes seconds without them on the 30-page crawl, and a test of
# how runs resume, compare or fail is not about them. tests/filters/test_unsafe.py and
# tests/filters/test_faces.py test the gates; `lait demo` (the session's demo run) runs them.
NO_GATES = ("--unsafe-model", "none")  # of `lait filter`
NO_FACES = ("--face-model", "none")  # of `lait build` and `lait select`
NO_GATES_CONFIG = {"unsafe_model": "none"}  # the same as a `filter:` section
NO_FACES_CONFIG = {"face_model": "none"}  # the same as a `build:` section


def stage_commands(work: str, model: Path, extra: list[str], *, regions: bool = True,
                   filter_args: tuple[str, ...] = (), gates: bool = False) -> list[list[str]]:
    """`lait filter/clean/score/build` on `work`, with region features unless told otherwise,
    and without the model gates (NO_GATES, NO_FACES) unless `gates`."""
    score = ["score", work, "--model", "tiny-clip", "--model-config", str(model), "--allow-random-init",
             "--batch-size", "16"]
    if regions:
        score += ["--regions", "--max-regions", "4", "--codebook-k", "4"]
    return [argv + extra for argv in (
        ["filter", work, *(() if gates else NO_GATES), *filter_args], ["clean", work, "--languages", "en", "de", "fr"],
        score,
        # A random-init model maps every image to nearly one point: no embedding near-dups.
        ["build", work, "--samples-per-shard", "40", "--no-use-embedding-dups", *(() if gates else NO_FACES)])]


def tables(work: WorkDir) -> dict[str, list[dict]]:
    """Every row of every table, in a canonical order."""
    return {t: sorted(work.read(t).to_pylist(), key=repr) for t in TABLES}


def part_bytes(work: WorkDir) -> dict[str, bytes]:
    """Every part file of every table, by table/name: what "byte for byte" compares."""
    return {f"{t}/{p.name}": storage.read_bytes(p) for t in TABLES for p in work.part_files(t)}


def shard_members(work: WorkDir) -> dict[str, bytes]:
    from lait.build.shards import shard_files

    out = {}
    for tar in shard_files(work):
        with storage.open_input(tar) as f, tarfile.open(fileobj=io.BytesIO(f.read())) as tf:
            for m in tf.getmembers():
                out[f"{tar.name}/{m.name}"] = tf.extractfile(m).read()
        out[tar.with_suffix(".parquet").name] = storage.read_bytes(tar.with_suffix(".parquet"))
    out["sizes.json"] = storage.read_bytes(work.root / "shards" / "sizes.json")
    return out


def run_to_samples(work: Path, config: str, lait) -> list[dict]:
    """`lait run WORK --config FILE` (the text `config`, one worker; `lait` runs the command):
    the JSON of every sample of its shards, after asserting that the run succeeded and shipped
    at least three samples."""
    import json

    path = work.parent / f"{work.name}-pipeline.yaml"
    path.write_text(config)
    done = lait("run", str(work), "--config", str(path), "--workers", "1", "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    samples = []
    for tar in sorted((work / "shards").glob("*.tar")):
        with tarfile.open(tar) as tf:
            samples += [json.load(io.TextIOWrapper(tf.extractfile(m))) for m in tf.getmembers()
                        if m.name.endswith(".json")]
    assert len(samples) >= 3, done.stderr[-2000:]
    return samples


def crawl_site(out: Path, pages: int = 30, max_pages: int = 0) -> None:
    """Crawl a generated site of `pages` pages into `out` (4 partitions, small parts); the same
    size of site is served on the same port each time, so that a resumed crawl sees its URLs."""
    from lait.crawler.config import CrawlConfig
    from lait.crawler.run import crawl
    from lait.testkit.generator import generate_site
    from lait.testkit.server import SiteServer

    with SiteServer(generate_site(pages, seed=5), port=PORTS.setdefault(pages, 0) or 0) as srv:
        PORTS[pages] = srv.port  # a resumed crawl must see the same URLs
        stats = crawl(CrawlConfig(seeds=[srv.url + "/"], out=str(out), allow_loopback=True, autothrottle=False,
                                  n_partitions=4, part_rows=5, max_pages=max_pages, log_level="WARNING"),
                      quiet=True)
    if stats["finish_reason"] not in ("finished", "max_pages"):
        raise RuntimeError(f"crawl of the generated site ended with {stats['finish_reason']!r}")


# The port each size of site was first served on: a resumed crawl must see the same URLs.
PORTS: dict[int, int] = {}


def write_csv(path: Path, rows: list[dict]) -> Path:
    """A URL list as a CSV file, its columns those of the first row (what `lait download` reads)."""
    import csv

    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path
