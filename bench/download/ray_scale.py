"""Benchmark: `lait download --executor ray` on one worker node, then on two (issue 30).

A local Ray cluster of separate nodes (`tests/kit/raycluster.py`: a head with no CPUs and worker
nodes of one CPU each, so one fetcher task runs per node), a loopback image server that answers
every request after `--latency` seconds (150 ms) under `--hosts` host names (16, all resolved
to it with `--resolve`), and a list of `--n` distinct image URLs (8,000) spread over them. Each
task fetches with `--concurrency` requests at once (8 per node), so the latency, not this
machine's two cores, bounds a node; AutoThrottle is off, robots.txt and TDMRep are on.

Rates are images stored per second of the whole `lait download` command (start-up, list reading
and planning included), one node and two nodes run one after the other on fresh work
directories. Target: two nodes at least 1.7x one. With `--check-local` the two-node tables are
also compared with a local run's (`--executor local`), as sets.

    .venv/bin/python bench/download/ray_scale.py [--n 8000] [--hosts 16] [--latency 0.15]
        [--concurrency 8] [--check-local]
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the test kit, tests/kit/


def tiny_jpegs(k: int = 64) -> list[bytes]:
    """`k` different small JPEGs (64x64, a few KB): the bytes do not matter, the round trips do."""
    from PIL import Image

    out = []
    for i in range(k):
        img = Image.new("RGB", (64, 64), ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=80)
        out.append(buf.getvalue())
    return out


def host_names(n: int) -> list[str]:
    return [f"img{i:02d}.lait-bench.test" for i in range(n)]


def make_site(n: int, hosts: int, latency: float):
    """The server's files and the list rows: URL i on host i % hosts."""
    from kit.photos import PhotoSite

    blobs = tiny_jpegs()
    names = host_names(hosts)
    files, rows = {}, []
    for i in range(n):
        path = f"/p/{i:06d}.jpg"
        files[path] = blobs[i % len(blobs)]
        rows.append((f"http://{names[i % hosts]}:{{port}}{path}", f"photo number {i}"))
    return PhotoSite(files, delay=latency), rows, names


def write_list(rows, port: int, path: Path) -> None:
    import csv

    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["url", "caption"])
        for url, caption in rows:
            w.writerow([url.format(port=port), caption])


def download(list_path: Path, work: Path, names: list[str], concurrency: int, *, executor: str,
             address: str | None = None, processes: int = 1) -> float:
    """Run `lait download`; its wall time."""
    cmd = [sys.executable, "-m", "lait", "download", str(list_path), "--out", str(work), "--concurrency",
           str(concurrency), "--per-domain", str(concurrency), "--no-autothrottle", "--allow-loopback",
           "--no-progress", "--log-level", "WARNING", "--executor", executor, "--processes", str(processes),
           "--resolve", *[f"{h}:*:127.0.0.1" for h in names]]
    if address:
        cmd += ["--ray-address", address]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def image_rows(work: Path) -> set[tuple]:
    """images/ as a set of (URL, page, status, error, SHA-256 of the bytes); ValueError when a URL
    has two rows."""
    import hashlib

    from lait.workdir import WorkDir

    rows = WorkDir(work).read("images", columns=["image_url", "page_url", "status", "error", "bytes"]).to_pylist()
    out = {(r["image_url"], r["page_url"], r["status"], r["error"],
            hashlib.sha256(r["bytes"] or b"").hexdigest()) for r in rows}
    if len({r["image_url"] for r in rows}) != len(rows):
        raise ValueError(f"{work}: an image URL has more than one row")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=8000)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--latency", type=float, default=0.15)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--check-local", action="store_true")
    args = ap.parse_args(argv)

    from kit.photos import PhotoServer
    from kit.raycluster import LocalRayCluster

    site, rows, names = make_site(args.n, args.hosts, args.latency)
    results = {}
    with tempfile.TemporaryDirectory(prefix="lait-bench-ray-") as tmp, PhotoServer(site) as server:
        tmp = Path(tmp)
        list_path = tmp / "list.csv"
        write_list(rows, server.port, list_path)
        for workers in (1, 2):
            with LocalRayCluster(workers=workers, cpus_per_worker=1) as cluster:
                work = tmp / f"ray-{workers}"
                seconds = download(list_path, work, names, args.concurrency, executor="ray",
                                   address=cluster.address)
            stored = len(image_rows(work))
            results[workers] = {"seconds": round(seconds, 2), "images": stored,
                                "images_per_s": round(stored / seconds, 1)}
            print(f"{workers} worker node(s): {stored} images in {seconds:.1f} s = {stored / seconds:.1f}/s",
                  flush=True)
        ratio = results[2]["images_per_s"] / results[1]["images_per_s"]
        print(f"two nodes / one node: {ratio:.2f} (target >= 1.7)")
        out = {"n": args.n, "hosts": args.hosts, "latency_s": args.latency, "concurrency_per_node": args.concurrency,
               "nodes": results, "ratio": round(ratio, 3)}
        if args.check_local:
            local = tmp / "local"
            download(list_path, local, names, 2 * args.concurrency, executor="local", processes=2)
            same = image_rows(local) == image_rows(tmp / "ray-2")
            print(f"tables of the two-node run equal a local run's (as sets): {same}")
            out["equal_to_local"] = same
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
