"""Resizing for shards: lait's `prepare` beside img2dataset's `Resizer`, every resize mode.

Data: the 87 photos of ../shared/data/photos/coco_train and photos/misc (mostly 640 px COCO
JPEGs; the misc ones 123 to 535 px, so some are enlarged), held in memory. One round resizes each
photo to 256 in each of img2dataset's modes (keep_ratio, center_crop, border,
keep_ratio_largest) and encodes it as JPEG quality 95 (img2dataset's default): decode, resize,
encode, as a shard writer does for a resized image. lait runs in this process; img2dataset 1.47.0
runs in its own environment (it pins old webdataset and pandas; built once under
~/.cache/lait/bench-img2dataset, as bench/download's), one child process per round that loads the
photos and times the same loop itself, so its interpreter start and imports are not counted.
Rounds alternate which side goes first. Rate: images per second, one core: both sides
run OpenCV on one thread (img2dataset's `Resizer` and lait's `prepare` each set it).

    .venv/bin/python bench/build/bench_resize.py [--rounds 5] [--img2dataset-python PATH]

Target (issue 35): lait at least 1.0 of img2dataset, every mode. `pairs()` yields the rate over
all modes for `bench/all.py`.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from pairs import Pair  # noqa: E402

MODES = ("keep_ratio", "center_crop", "border", "keep_ratio_largest")
SIZE, QUALITY = 256, 95
TARGET = 1.0

# Run by img2dataset's Python: argv = photos-list file; prints {"seconds": {mode: s}, "images": n}.
PEER = """
import io, json, sys, time
from img2dataset.resizer import Resizer
paths = open(sys.argv[1]).read().split()
photos = [open(p, "rb").read() for p in paths]
seconds = {}
for mode in %(modes)r:
    r = Resizer(image_size=%(size)d, resize_mode=mode, resize_only_if_bigger=False,
                encode_format="jpg", encode_quality=%(quality)d)
    for data in photos[:5]:
        r(io.BytesIO(data))  # warm-up
    t = time.perf_counter()
    for data in photos:
        err = r(io.BytesIO(data))[-1]
        if err is not None:
            raise SystemExit(err)
    seconds[mode] = time.perf_counter() - t
print(json.dumps({"seconds": seconds, "images": len(photos)}))
""" % {"modes": MODES, "size": SIZE, "quality": QUALITY}


def photos() -> list[Path]:
    base = REPO.parent / "shared" / "data" / "photos"
    return sorted([*(base / "coco_train").glob("*.jpg"), *(base / "misc").glob("*.jpg")])


def img2dataset_python(given: str | None) -> str:
    """bench/download's img2dataset environment (built there on first use)."""
    spec = importlib.util.spec_from_file_location("bench_download", REPO / "bench" / "download" / "bench_download.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.img2dataset_python(given)


class ResizeBench:
    def __init__(self, paths: list[Path], python: str, tmp: Path):
        from PIL import Image

        self.paths, self.python = paths, python
        self.data = [p.read_bytes() for p in paths]
        self.sizes = []
        for data in self.data:
            with Image.open(io.BytesIO(data)) as im:
                self.sizes.append(im.size)
        self.list_file = tmp / "photos.txt"
        self.list_file.write_text("\n".join(map(str, paths)))
        self.script = tmp / "peer.py"
        self.script.write_text(PEER)

    def lait_seconds(self) -> dict[str, float]:
        from lait.build.resize import ImageOptions, prepare

        out = {}
        for mode in MODES:
            opts = ImageOptions(mode, SIZE, False, "jpg", QUALITY, blur_faces=False)
            for data, (w, h) in list(zip(self.data, self.sizes))[:5]:
                prepare(data, "JPEG", w, h, opts)  # warm-up, as the peer's
            t = time.perf_counter()
            for data, (w, h) in zip(self.data, self.sizes):
                prepare(data, "JPEG", w, h, opts)
            out[mode] = time.perf_counter() - t
        return out

    def peer_seconds(self) -> dict[str, float]:
        proc = subprocess.run([self.python, str(self.script), str(self.list_file)], capture_output=True,
                              text=True, check=True, timeout=600)
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result["images"] == len(self.data)
        return result["seconds"]

    def rate(self, seconds: dict[str, float]) -> float:
        return len(self.data) * len(seconds) / sum(seconds.values())


@contextmanager
def pairs(quick: bool = False, python: str | None = None):
    paths = photos()
    if not paths:
        sys.exit("../shared/data/photos is absent")
    if quick:
        paths = paths[:20]
    with tempfile.TemporaryDirectory(prefix="lait-bench-resize-") as tmp:
        b = ResizeBench(paths, img2dataset_python(python), Path(tmp))
        yield [Pair("resize", f"lait prepare, {len(MODES)} modes to {SIZE}, jpg q{QUALITY}, 1 core",
                    "img2dataset 1.47.0 Resizer, same", "img/s", TARGET,
                    lambda: b.rate(b.lait_seconds()), lambda: b.rate(b.peer_seconds()))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--img2dataset-python", help="a Python with img2dataset 1.47.0 (default: built once)")
    args = ap.parse_args()
    if not photos():
        print("bench/build/bench_resize: ../shared/data/photos is not present; nothing to measure")
        return 0
    with tempfile.TemporaryDirectory(prefix="lait-bench-resize-") as tmp:
        b = ResizeBench(photos(), img2dataset_python(args.img2dataset_python), Path(tmp))
        lait: dict[str, list[float]] = {m: [] for m in MODES}
        peer: dict[str, list[float]] = {m: [] for m in MODES}
        ratios = []
        for r in range(args.rounds):
            sides = [("lait", b.lait_seconds), ("peer", b.peer_seconds)]
            got = {name: fn() for name, fn in (sides if r % 2 else sides[::-1])}
            for m in MODES:
                lait[m].append(len(b.data) / got["lait"][m])
                peer[m].append(len(b.data) / got["peer"][m])
            ratios.append(b.rate(got["lait"]) / b.rate(got["peer"]))
        n = len(b.data)
        print(f"bench/build/bench_resize: {n} photos to {SIZE}, jpg q{QUALITY}, median of {args.rounds} rounds (img/s)")
        print(f"{'mode':<20} {'lait':>8} {'img2dataset':>12} {'ratio':>6}  spread")
        for m in MODES:
            per = [a / p for a, p in zip(lait[m], peer[m])]
            print(f"{m:<20} {statistics.median(lait[m]):8.1f} {statistics.median(peer[m]):12.1f} "
                  f"{statistics.median(per):6.2f}  {min(per):.2f}-{max(per):.2f}")
        print(f"all modes: ratio {statistics.median(ratios):.2f} (spread {min(ratios):.2f}-{max(ratios):.2f}, "
              f"target >= {TARGET:.2f})")
        print(f"ratio resize {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
