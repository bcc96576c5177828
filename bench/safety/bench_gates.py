"""What the consent and safety gates cost in the whole default pipeline, gates on beside gates off (issue 61).

Data: the 80 COCO photos of ../shared/data/photos/coco_train (640 px, people among them), each
saved under VARIANTS distinct crops and JPEG qualities (every one passes the default min_side
300), with its first human caption; served from loopback and fetched by `lait download` from a
URL list, as a user with a caption list runs it. Then, as commands, each in its own process:

    lait filter W    (stage 2: XMP/C2PA reservations and the unsafe model open_nsfw when on)
    lait clean W     (stage 3)
    lait score W --model demo   (stage 4: the offline scorer)
    lait build W     (stage 5: the face search MTCNN on every picture it writes, when on)

once with the gates at their defaults and once with them off (`--no-obey-reservations
--unsafe-model none` for stage 2, `--face-model none` for stage 5), on copies of one download.
The CPU of each whole command (user + system of the process and its workers, from
`getrusage(RUSAGE_CHILDREN)`) is divided by the images downloaded. Then the same again with
`lait build --top-fraction 0.33`: a build where only a third of the pictures can ship, as on the
real web, where most candidates fail a later rule (LAION's CLIP filter kept about one in ten).

Prints stage 2's images per CPU-second with the gates on and off (issue 61's acceptance 1:
at least 50 with them on) and stages 2-5's CPU per input image on and off (acceptance 2: the
gates add at most 50 %).

    .venv/bin/python bench/safety/bench_gates.py [--variants 3] [--workers 1]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the test kit, tests/kit/

STAGE2_TARGET = 50.0  # images per CPU-second, stage 2 with its default gates
ADDED_TARGET = 0.5  # the gates' share added to stages 2-5's CPU per input image, at most
# (left, top, right, bottom) crop fractions and JPEG quality of each variant of a photo.
VARIANTS = [((0.0, 0.0, 1.0, 1.0), 90), ((0.04, 0.03, 0.97, 0.98), 85), ((0.02, 0.06, 0.95, 1.0), 80),
            ((0.06, 0.0, 1.0, 0.94), 92), ((0.0, 0.05, 0.93, 0.97), 75), ((0.03, 0.02, 0.98, 0.96), 88)]
GATES_OFF = {"filter": ["--no-obey-reservations", "--unsafe-model", "none"], "build": ["--face-model", "none"]}


def web_photos(n_variants: int) -> list[tuple[str, bytes, str]]:
    """(file name, JPEG bytes, caption) of every variant of every COCO photo."""
    from PIL import Image

    from kit.photos import coco_photos

    folder = REPO.parent / "shared" / "data" / "photos" / "coco_train"
    if not (folder / "captions.json").exists():
        sys.exit(f"{folder} is absent: no real photos to measure on")
    out = []
    for photo, caption in coco_photos(folder):
        with Image.open(photo) as im:
            im = im.convert("RGB")
            w, h = im.size
            for k, ((l, t, r, b), quality) in enumerate(VARIANTS[:n_variants]):
                crop = im.crop((round(l * w), round(t * h), round(r * w), round(b * h)))
                if min(crop.size) < 300:
                    continue
                buf = io.BytesIO()
                crop.save(buf, "JPEG", quality=quality)
                out.append((f"{photo.stem}-{k}.jpg", buf.getvalue(), caption))
    return out


def cpu_of(argv: list[str]) -> float:
    """CPU seconds (user + system) of a lait command and every process it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "lait", *argv], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"lait {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_stages(src: Path, work: Path, gates: bool, workers: int, build_extra: list[str]) -> dict[str, float]:
    """CPU seconds of stages 2-5 on a copy of the downloaded work directory `src`."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work)
    common = ["--workers", str(workers), "--no-progress"]
    off = {} if gates else GATES_OFF
    return {
        "filter": cpu_of(["filter", str(work), *common, *off.get("filter", [])]),
        "clean": cpu_of(["clean", str(work), "--languages", "en", *common]),
        "score": cpu_of(["score", str(work), "--model", "demo", *common]),
        "build": cpu_of(["build", str(work), *common, *build_extra, *off.get("build", [])]),
    }


def shipped(work: Path) -> int:
    stats = json.loads((work / "shards" / "stats.json").read_text())
    return int(stats["samples"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", type=int, default=3, help=f"distinct copies of each photo (at most {len(VARIANTS)})")
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()

    from kit.photos import PhotoServer, PhotoSite

    photos = web_photos(args.variants)
    tmp = Path(tempfile.mkdtemp(prefix="bench-gates-"))
    server = PhotoServer(PhotoSite({f"/p/{name}": data for name, data, _ in photos}), host="127.0.61.1").start()
    try:
        listed = tmp / "photos.csv"
        with open(listed, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["url", "caption"])
            w.writerows([server.url + f"/p/{name}", caption] for name, _, caption in photos)
        src = tmp / "downloaded"
        download = cpu_of(["download", str(listed), "--out", str(src), "--allow-loopback", "--no-autothrottle",
                           "--log-level", "WARNING", "--no-progress"])
        from lait.workdir import WorkDir

        n = WorkDir(src).count("images")
        if n != len(photos):
            sys.exit(f"lait download wrote {n} image rows for {len(photos)} photos")
        print(f"{n} distinct web-size photos ({len(photos) // args.variants} COCO photos x {args.variants} crops and "
              f"qualities, {sum(len(d) for _, d, _ in photos) / len(photos) / 1e3:.0f} KB on average) with their COCO "
              f"captions; lait download took {download:.1f} CPU-s; {args.workers} worker(s)")
        for label, extra in (("every picture can ship", []), ("a third can ship (--top-fraction 0.33)",
                                                               ["--top-fraction", "0.33"])):
            figures = {}
            for gates in (False, True):
                work = tmp / ("on" if gates else "off")
                figures[gates] = run_stages(src, work, gates, args.workers, extra)
                figures[gates]["shipped"] = shipped(work)
            off, on = figures[False], figures[True]
            print(f"\n{label}: shipped {on['shipped']} of {n} ({on['shipped'] / n:.0%}) with the gates on, "
                  f"{off['shipped']} off")
            print(f"  {'stage':8s} {'gates off':>12s} {'gates on':>12s}   (CPU ms per input image)")
            for stage in ("filter", "clean", "score", "build"):
                print(f"  {stage:8s} {off[stage] / n * 1e3:12.1f} {on[stage] / n * 1e3:12.1f}")
            total_off = sum(off[s] for s in ("filter", "clean", "score", "build"))
            total_on = sum(on[s] for s in ("filter", "clean", "score", "build"))
            added = total_on / total_off - 1
            print(f"  {'2-5':8s} {total_off / n * 1e3:12.1f} {total_on / n * 1e3:12.1f}   gates add {added:.0%} "
                  f"(target <= {ADDED_TARGET:.0%}): " + ("PASS" if added <= ADDED_TARGET else "FAIL"))
            if not extra:
                rate_on, rate_off = n / on["filter"], n / off["filter"]
                print(f"  stage 2 (whole command): {rate_on:.1f} images per CPU-second with its default gates, "
                      f"{rate_off:.1f} without (target >= {STAGE2_TARGET:.0f}): "
                      + ("PASS" if rate_on >= STAGE2_TARGET else "FAIL"))
    finally:
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
