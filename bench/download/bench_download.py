"""Benchmark: images per second of `lait download` beside img2dataset on the same URL list.

Data: the real photos of ../shared/data/photos (COCO and misc, ~150 KB JPEGs) repeated to N
distinct URLs, spread over H loopback hosts (127.0.20.1, .2, ...) served by this process
(`tests/kit/photos.py`), as a CSV list with a caption column. Both tools download every URL
with the same concurrency and no resizing or re-encoding, one after the other, alternating:

- img2dataset 1.47.0, in its own virtual environment (BASELINES.md: it pins old webdataset and
  pandas): ``--processes_count P --thread_count C/P --resize_mode no --skip_reencode True``,
  WebDataset output;
- ``lait download`` with ``--processes P --concurrency C --per-domain C/H`` (H hosts: the
  same total; each process fetches its share of the hosts), AutoThrottle off (the server's
  latency sets the pace, as for img2dataset), robots.txt and TDMRep on (one small request per
  host each), Parquet output.

Rates are images stored per second of wall time of each whole command (start-up and list
reading included), median over repeats, for each process count (`--processes 1 2`: both tools
with one process each, then two each). Targets (issue 30): lait / img2dataset >= 1.0 with one
process, >= 1.3 with two.

    .venv/bin/python bench/download/bench_download.py [--n 2000] [--hosts 4] [--concurrency 32]
        [--processes 1 2] [--repeats 3] [--img2dataset-python PATH]

Without --img2dataset-python, img2dataset is installed once from PyPI into
~/.cache/lait/bench-img2dataset (python3 -m venv + pip install img2dataset==1.47.0).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the test kit, tests/kit/
sys.path.insert(0, str(REPO / "bench"))

from pairs import Pair  # noqa: E402

IMG2DATASET = "img2dataset==1.47.0"
DEFAULT_VENV = Path.home() / ".cache" / "lait" / "bench-img2dataset"


def img2dataset_python(given: str | None) -> str:
    if given:
        return given
    python = DEFAULT_VENV / "bin" / "python"
    if not python.exists():
        print(f"installing {IMG2DATASET} into {DEFAULT_VENV} (once) ...", file=sys.stderr)
        subprocess.run(["python3", "-m", "venv", str(DEFAULT_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", IMG2DATASET], check=True)
    return str(python)


def photos() -> list[bytes]:
    found = sorted((REPO.parent / "shared" / "data" / "photos").rglob("*.jpg"))
    if not found:
        sys.exit("../shared/data/photos is absent")
    return [p.read_bytes() for p in found]


def run_img2dataset(python: str, listing: Path, out: Path, processes: int, threads: int) -> tuple[float, int]:
    script = str(Path(python).parent / "img2dataset")  # the package has no __main__
    cmd = [script, "--url_list", str(listing), "--input_format", "csv",
           "--url_col", "url", "--caption_col", "caption", "--output_format", "webdataset",
           "--output_folder", str(out), "--processes_count", str(processes), "--thread_count", str(threads),
           "--resize_mode", "no", "--skip_reencode", "True", "--distributor", "multiprocessing",
           "--enable_wandb", "False", "--timeout", "10", "--retries", "0", "--number_sample_per_shard", "1000"]
    env = dict(os.environ, NO_ALBUMENTATIONS_UPDATE="1")
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    stored = sum(json.loads(p.read_text())["successes"] for p in out.glob("*_stats.json"))
    return stored / seconds, stored


def run_lait(listing: Path, out: Path, processes: int, concurrency: int, per_domain: int) -> tuple[float, int]:
    from lait.workdir import WorkDir

    cmd = [sys.executable, "-m", "lait", "download", str(listing), "--out", str(out), "--allow-loopback",
           "--no-autothrottle", "--processes", str(processes), "--concurrency", str(concurrency),
           "--per-domain", str(per_domain),
           "--download-timeout", "10", "--retries", "0", "--log-level", "WARNING", "--no-progress"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    stored = sum(1 for r in WorkDir(out).iter_rows("images", columns=["error"]) if r["error"] is None)
    return stored / seconds, stored


TARGET = 1.0
TARGETS = {1: 1.0, 2: 1.3}  # by process count of both tools (issue 30)


@contextlib.contextmanager
def photo_list(n: int, hosts: int):
    """Serve the photos repeated to `n` URLs from `hosts` loopback hosts; yield (list, tmp, MB)."""
    from kit.photos import PhotoServer, PhotoSite

    data = photos()
    per_host = [dict() for _ in range(hosts)]
    for i in range(n):
        per_host[i % hosts][f"/photo/{i:06d}.jpg"] = data[i % len(data)]
    servers = [PhotoServer(PhotoSite(files), host=f"127.0.20.{h + 1}").start() for h, files in enumerate(per_host)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            listing = Path(tmp) / "list.csv"
            with open(listing, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["url", "caption"])
                for h, files in enumerate(per_host):
                    for path in files:
                        w.writerow([servers[h].url + path, f"photo {path}"])
            yield listing, Path(tmp), sum(len(b) for files in per_host for b in files.values()) / 1e6
    finally:
        for s in servers:
            s.close()


def rounds(listing: Path, tmp: Path, python: str, processes: int, concurrency: int, hosts: int):
    """(lait round, img2dataset round): each downloads the whole list into a new folder."""
    def lait_round() -> float:
        return run_lait(listing, Path(tempfile.mkdtemp(dir=tmp)), processes, concurrency,
                        max(1, concurrency // hosts))[0]

    def peer_round() -> float:
        return run_img2dataset(python, listing, Path(tempfile.mkdtemp(dir=tmp)), processes,
                               max(1, concurrency // processes))[0]

    return lait_round, peer_round


@contextlib.contextmanager
def pairs(quick: bool = False):
    """`lait download` beside img2dataset on one list (bench/all.py)."""
    n, hosts, concurrency, processes = (400 if quick else 2000), 4, 32, 2
    try:
        python = img2dataset_python(None)
    except (OSError, subprocess.CalledProcessError) as exc:
        sys.exit(f"img2dataset cannot be installed here: {exc}")
    with photo_list(n, hosts) as (listing, tmp, _):
        lait_round, peer_round = rounds(listing, tmp, python, processes, concurrency, hosts)
        yield [Pair("download", f"lait download, {n} photos from {hosts} loopback hosts",
                    f"{IMG2DATASET}, {processes} x {concurrency // processes} threads, no resize",
                    "img/s", TARGETS.get(processes, TARGET), lait_round, peer_round)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="URLs in the list")
    parser.add_argument("--hosts", type=int, default=4, help="loopback hosts serving them")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight, both tools")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2],
                        help="process counts of both tools, each measured in turn (img2dataset's threads: "
                             "concurrency / processes)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--img2dataset-python", help="python of an environment with img2dataset")
    args = parser.parse_args(argv)

    python = img2dataset_python(args.img2dataset_python)
    ratios = {}
    with photo_list(args.n, args.hosts) as (listing, tmp, mb):
        print(f"{args.n} photos ({mb:.0f} MB) on {args.hosts} loopback hosts; concurrency "
              f"{args.concurrency} in all, {args.concurrency // args.hosts} per host for lait; no resizing", flush=True)
        for processes in args.processes:
            results: dict[str, list[float]] = {"img2dataset": [], "lait": []}
            lait_round, peer_round = rounds(listing, tmp, python, processes, args.concurrency, args.hosts)
            print(f"{processes} process(es) each (img2dataset {processes} x {args.concurrency // processes} "
                  f"threads; lait {processes} fetcher process(es))", flush=True)
            for r in range(args.repeats):
                for name in (("img2dataset", "lait") if r % 2 == 0 else ("lait", "img2dataset")):
                    rate = lait_round() if name == "lait" else peer_round()
                    results[name].append(rate)
                    print(f"  round {r + 1}: {name:12s} {rate:7.1f} images/s", flush=True)
            i2d, lait_rate = statistics.median(results["img2dataset"]), statistics.median(results["lait"])
            ratios[processes] = lait_rate / i2d
            print(f"  img2dataset: {i2d:.1f} images/s; lait download: {lait_rate:.1f} images/s", flush=True)
    for processes, ratio in ratios.items():
        target = TARGETS.get(processes, TARGET)
        print(f"ratio lait / img2dataset, {processes} process(es) each: {ratio:.2f} (target >= {target})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
