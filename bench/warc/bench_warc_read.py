"""Read speed of WarcReader (FastWARC) against warcio's ArchiveIterator, side by side.

Both read every response block of ../shared/data/warc/pywb/iana.warc.gz (repeated N times
in one temporary archive) and undo HTTP chunking/content encoding; then the full ingest
(`ingest_file`: parsing, link extraction, Parquet) is timed on the same archive.

    .venv/bin/python bench/warc/bench_warc_read.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from lait.crawler.warc import WarcReader, decode_body, parse_http  # noqa: E402
from lait.crawler.warc_ingest import IngestOptions, ingest_file  # noqa: E402


def read_lait(path: Path) -> int:
    n = 0
    for rec in WarcReader(path, check_gzip=False):
        if rec.type == "response" and rec.block:
            n += len(decode_body(parse_http(rec.block))[0])
    return n


def read_warcio(path: Path) -> int:
    from warcio.archiveiterator import ArchiveIterator

    n = 0
    with open(path, "rb") as f:
        for rec in ArchiveIterator(f):
            if rec.rec_type == "response":
                n += len(rec.content_stream().read())
    return n


def best(fn, path: Path, runs: int = 3) -> tuple[float, int]:
    times, out = [], 0
    for _ in range(runs):
        t = time.perf_counter()
        out = fn(path)
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    src = REPO.parent / "shared" / "data" / "warc" / "pywb" / "iana.warc.gz"
    if not src.exists():
        print("skip: ../shared/data is absent")
        return
    tmp = Path(tempfile.mkdtemp())
    try:
        big = tmp / "iana-x.warc.gz"
        with open(big, "wb") as out:
            for _ in range(args.repeat):
                out.write(src.read_bytes())  # concatenated gzip members: still a valid WARC
        mb = big.stat().st_size / 1e6
        t_lait, n1 = best(read_lait, big)
        t_wio, n2 = best(read_warcio, big)
        print(f"archive: {mb:.1f} MB gzip, {args.repeat} x iana.warc.gz")
        print(f"lait WarcReader (fastwarc): {mb / t_lait:8.1f} MB/s  ({n1 / 1e6:.1f} MB payload)")
        print(f"warcio ArchiveIterator:     {mb / t_wio:8.1f} MB/s  ({n2 / 1e6:.1f} MB payload)")
        print(f"ratio lait/warcio: {t_wio / t_lait:.2f}x")
        t = time.perf_counter()
        rep = ingest_file(big, tmp / "W", IngestOptions())
        dt = time.perf_counter() - t
        print(f"full ingest_file: {mb / dt:.1f} MB/s, {rep.records / dt:.0f} records/s, "
              f"{rep.pages / dt:.0f} pages/s ({rep.pages} pages, {rep.links} links)")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
