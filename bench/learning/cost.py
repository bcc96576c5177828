"""CPU cost of the packaged offline models, per image and per text (docs/performance.md).

    python bench/learning/cost.py [--images 256] [--threads 2]

Measured in one process with a fixed thread count, on real photos (the Flickr8k val split of
../shared/data, decoded beforehand so that decoding is not counted): loading each model (once
per process: a second load is a cache hit, checked here), the offline scorer's image side
(`lait score --model imagenet-concepts`: classifier + concept embedding) and text side (MiniLM),
and the trainer's `cnn` region source at 49 and 16 regions. Each figure is CPU seconds (user +
system of this process) per item and items per wall second, the median of --rounds rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # the test kit, tests/kit/


def timed(fn, n: int, rounds: int) -> dict:
    cpu, wall = [], []
    for _ in range(rounds):
        c0, t0 = os.times(), time.perf_counter()
        fn()
        c1 = os.times()
        cpu.append((c1.user - c0.user + c1.system - c0.system) / n)
        wall.append(n / (time.perf_counter() - t0))
    return {"cpu_s_per_item": round(statistics.median(cpu), 4), "items_per_s": round(statistics.median(wall), 1),
            "items": n, "rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "photos" / "flickr8k")
    args = ap.parse_args()
    if not (args.data / "karpathy.json").is_file():
        sys.exit(f"{args.data} is missing")
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from kit.photo_shards import split_items
    from lait.models import load_image_classifier, load_sentence_encoder
    from lait.scoring.concepts import load_concept_scorer
    from lait.scoring.decode import ImageDecoder
    from lait.train.config import RegionConfig
    from lait.train.data import image_tensor
    from lait.train.regions import CnnRegions

    out: dict = {"threads": args.threads, "load_cpu_s": {}}
    for name, load in (("efficientnet-lite0", load_image_classifier), ("all-minilm-l6-v2", load_sentence_encoder)):
        c0 = os.times()
        first = load()
        c1 = os.times()
        assert load() is first  # once per process
        out["load_cpu_s"][name] = round(c1.user - c0.user + c1.system - c0.system, 2)
    scorer = load_concept_scorer("cpu")
    items = split_items(args.data / "karpathy.json", "val", args.images)
    raws = [(it["filename"], (args.data / "images" / it["filename"]).read_bytes()) for it in items]
    pixels = ImageDecoder(scorer.preprocess_cfg)(raws).pixels
    texts = [s["raw"] for it in items for s in it["sentences"]]

    def score_images():
        for i in range(0, len(pixels), 64):
            scorer.encode_images(pixels[i:i + 64])

    out["score_image"] = timed(score_images, len(pixels), args.rounds)
    out["score_text"] = timed(lambda: scorer.encode_texts(texts), len(texts), args.rounds)

    def score_regions():
        for i in range(0, len(pixels), 64):
            scorer.encode_images(pixels[i:i + 64], tokens=True)

    out["score_image_with_regions"] = timed(score_regions, len(pixels), args.rounds)
    batch = torch.stack([image_tensor(raw, 224) for _, raw in raws])
    for r in (49, 16):
        regions = CnnRegions(RegionConfig(source="cnn", max_regions=r), r)

        def run(regions=regions):
            with torch.inference_mode():
                for i in range(0, len(batch), 64):
                    regions(batch[i:i + 64])

        out[f"cnn_regions_{r}"] = timed(run, len(batch), args.rounds)
    out["numpy"] = np.__version__
    out["torch"] = torch.__version__
    out["load_average"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
