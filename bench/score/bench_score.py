"""Benchmark of stage 4: the whole `lait score` stage beside the model alone, same run.

    python bench/score/bench_score.py [--images 128] [--model ViT-B-32] [--batch 32] [--rounds 2]

Data: the real COCO photos of ../shared/data/photos/coco_train (640 px JPEGs) under distinct URLs,
each with 3 candidate texts drawn from their human captions plus repeated junk alt texts (alt
texts repeat on the web, so de-duplication matters). Weights are random (`allow_random_init`):
speed does not depend on them, and nothing can be downloaded here.

Prints:
- pairs/s of the whole stage (`score_work`: Parquet in, decode in worker processes, model,
  Parquet out) and of the model alone on pre-decoded pixels (same scorer object, batch, device,
  the same distinct texts), and their ratio (target >= 0.9);
- the text-encoding time with and without de-duplication, and the time de-duplication saves;
- on CUDA: ViT-B-32 images/s in bf16 beside LAION's published anchor (~1,800/s on one A100).

`pairs()` yields the stage beside the model alone for `bench/all.py`.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the test kit, tests/kit/
sys.path.insert(0, str(REPO / "bench"))

from pairs import Pair  # noqa: E402

from kit.scoring_data import tiny_config_file, write_work  # noqa: E402
from lait.scoring.config import ScoreConfig  # noqa: E402
from lait.scoring.decode import ImageDecoder  # noqa: E402
from lait.scoring.model import get_scorer  # noqa: E402
from lait.scoring.pipeline import score_work  # noqa: E402

TARGET = 0.9  # whole stage / model alone
JUNK = ["image", "photo", "click here", "IMG_2041.JPG", "logo", "untitled", "DSC01234.jpg", "picture"]


def load_data(n: int, seed: int = 0):
    photos = REPO.parent / "shared" / "data" / "photos" / "coco_train"
    if not photos.is_dir():
        sys.exit(f"skipped: {photos} is not present (a fresh clone has no ../shared)")
    caps = json.loads((photos / "captions.json").read_text())
    by_file = {}
    names = {im["id"]: im["file_name"] for im in caps["images"]}
    for a in caps["annotations"]:
        by_file.setdefault(names[a["image_id"]], []).append(a["caption"].strip())
    files = sorted(p for p in photos.glob("*.jpg") if p.name in by_file)
    rng = random.Random(seed)
    images, cands = {}, []
    for i in range(n):
        f = files[i % len(files)]
        url = f"http://bench/{i:05d}/{f.name}"
        images[url] = f.read_bytes()
        texts = [(rng.choice(by_file[f.name]), "alt"), (rng.choice(JUNK), "alt"), (rng.choice(JUNK), "title")]
        cands.append((f"http://bench/page{i // 4}", url, texts))
    return images, cands


def time_model_alone(scorer, cfg, pixels_batches, distinct_texts):
    import numpy as np

    start = time.perf_counter()
    t = scorer.encode_texts(distinct_texts, cfg.text_batch_size)
    embs = [scorer.encode_images(p) for p in pixels_batches]
    _ = np.concatenate(embs) @ t.T
    return time.perf_counter() - start


class ScoreBench:
    """One scorer loaded once, the images decoded once for the model alone, a work dir per round."""

    def __init__(self, tmp: Path, n_images: int, cfg: ScoreConfig):
        self.tmp, self.cfg = tmp, cfg
        self.images, self.cands = load_data(n_images)
        self.pair_texts = [t for _, _, ts in self.cands for t, _ in ts]
        self.distinct = list(dict.fromkeys(self.pair_texts))
        self.n_pairs = len(self.pair_texts)
        self.scorer = get_scorer(cfg)  # loaded once; the stage reuses this process's cached model
        decoder = ImageDecoder(self.scorer.preprocess_cfg, cfg.fast_decode)
        urls, batch = list(self.images), cfg.batch_size
        self.pixels = [decoder([(u, self.images[u]) for u in urls[i: i + batch]]).pixels
                       for i in range(0, len(urls), batch)]
        # Warm-up (first calls allocate); not timed.
        time_model_alone(self.scorer, cfg, self.pixels[:1], self.distinct[:8])
        self.rounds = 0

    def model_alone_seconds(self) -> float:
        return time_model_alone(self.scorer, self.cfg, self.pixels, self.distinct)

    def stage_seconds(self) -> float:
        self.rounds += 1
        root = self.tmp / f"work{self.rounds}"
        work = write_work(root, self.images, self.cands, n_partitions=1)
        start = time.perf_counter()
        report = score_work(self.cfg.replace(work=str(work.root)))
        seconds = time.perf_counter() - start
        assert report.ok and work.count("scored") == self.n_pairs, report.summary()
        shutil.rmtree(root)
        return seconds


@contextmanager
def pairs(quick: bool = False, n_images: int | None = None):
    """The whole stage beside the model alone; quick: a tiny open_clip config and 16 images."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-score-"))
    try:
        model = {"model_config": str(tiny_config_file(tmp, "lait-bench-tiny"))} if quick else {"model": "ViT-B-32"}
        cfg = ScoreConfig(work="", allow_random_init=True, batch_size=32, progress=False, loader_workers=2, **model)
        b = ScoreBench(tmp, n_images or (16 if quick else 128), cfg)
        label = "tiny config" if quick else "ViT-B-32"
        yield [Pair("score", f"lait score (stage 4), {label} random init, batch 32, 2 decode workers, "
                    f"{len(b.images)} images", "the same model alone on pre-decoded pixels", "pairs/s", TARGET,
                    lambda: b.n_pairs / b.stage_seconds(), lambda: b.n_pairs / b.model_alone_seconds())]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--model", default="ViT-B-32")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--loader-workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()

    import torch

    tmp = Path(tempfile.mkdtemp(prefix="bench-score-"))
    base = ScoreConfig(work="", model=args.model, allow_random_init=True, batch_size=args.batch, progress=False,
                       loader_workers=args.loader_workers, device=args.device)
    b = ScoreBench(tmp, args.images, base)
    scorer, pair_texts, distinct, n_pairs = b.scorer, b.pair_texts, b.distinct, b.n_pairs
    print(f"device {scorer.device}, torch threads {torch.get_num_threads()}, model {args.model} (random init), "
          f"{len(b.images)} images, {n_pairs} pairs, {len(distinct)} distinct texts, batch {args.batch}")

    alone, stage = [], []
    for _ in range(args.rounds):
        alone.append(b.model_alone_seconds())
        stage.append(b.stage_seconds())
    a, s = min(alone), min(stage)
    print(f"model alone (pre-decoded pixels, distinct texts): {n_pairs / a:8.1f} pairs/s  ({a:.2f} s)  runs {['%.2f' % x for x in alone]}")
    print(f"whole stage (lait score, {args.loader_workers} decode workers):      {n_pairs / s:8.1f} pairs/s  ({s:.2f} s)  runs {['%.2f' % x for x in stage]}")
    print(f"ratio stage / model alone: {a / s:.2f}  (target >= {TARGET})")

    start = time.perf_counter()
    scorer.encode_texts(pair_texts, base.text_batch_size)
    every = time.perf_counter() - start
    start = time.perf_counter()
    scorer.encode_texts(distinct, base.text_batch_size)
    once = time.perf_counter() - start
    print(f"text encoding: every pair's text {every:.2f} s ({n_pairs} texts) vs distinct texts {once:.2f} s "
          f"({len(distinct)}): de-duplication saves {every - once:.2f} s ({(every - once) / every:.0%} of text time, "
          f"{(every - once) / (s + every - once):.0%} of the stage)")

    if scorer.device.startswith("cuda"):
        gpu = get_scorer(base.replace(model="ViT-B-32", batch_size=256))
        x = torch.randint(0, 255, (256, 224, 224, 3), dtype=torch.uint8).numpy()
        gpu.encode_images(x)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            gpu.encode_images(x)
        torch.cuda.synchronize()
        print(f"ViT-B-32 bf16 on {torch.cuda.get_device_name()}: {2560 / (time.perf_counter() - start):.0f} images/s "
              "(LAION anchor: ~1,800/s on one A100)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
