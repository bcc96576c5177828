"""ImageBERT and the offline scorer on real photos: the shared Flickr8k split (docs/learning.md).

    python bench/learning/flickr8k.py --work /tmp/f8k            # everything, in order
    python bench/learning/flickr8k.py --work /tmp/f8k --only scorer

Steps (each skipped when its output exists, so a rerun continues):
1. ``scorer``: `lait score`'s offline scorer (`imagenet-concepts`) zero-shot on the test split,
   beside ConSE (top-5 classes, no temperature, no centring) computed from the same models.
2. ``shards``: the train split as WebDataset shards, one sample per human caption, each with its
   regions: EfficientNet-Lite0's 7 x 7 cells pooled to ``--regions`` and their ImageNet labels, computed by the
   trainer's own `cnn` region source (so training reads them and evaluation recomputes them
   identically from the JPEGs).
3. ``pretrain``: `lait train pretrain` from MiniLM (MLM, MOC, MRFR, ITM, ITC), then a second
   stage of ITC alone over larger batches.
4. ``finetune``: `lait train finetune` from the pretrained checkpoint.
5. ``eval``: `lait train eval --karpathy-json` on the test split, after pretraining (zero-shot)
   and after finetuning, in embedding and shortlist modes on all test images and full mode on the first
   ``--full-limit`` images (full mode scores every pair with the cross-encoder: 875 x 4,375
   pairs would take days on a CPU; the shortlist's ``--shortlist-k`` candidates per query are
   re-ranked by it).

Every figure is printed with the CPU time of the command that produced it. The split and its
photos come from ../shared/data/photos/flickr8k; nothing from it is written into the repo.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # the test kit, tests/kit/
DATA = REPO.parent / "shared" / "data" / "photos" / "flickr8k"
HERE = Path(__file__).resolve().parent


def set_data(folder: Path) -> None:
    global DATA
    DATA = folder.resolve()


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def lait(*args: str) -> float:
    """Run `python -m lait ARGS`; returns its CPU seconds (user + system, all its processes)."""
    before, t0 = children_cpu(), time.time()
    print("$ lait " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "lait", *args], check=True, cwd=REPO)
    cpu = children_cpu() - before
    print(f"  ({cpu:.0f} CPU s, {time.time() - t0:.0f} s wall)", flush=True)
    return cpu


def split_items(split: str) -> list[dict]:
    from kit.photo_shards import split_items as items

    return items(DATA / "karpathy.json", split)


def step_scorer(work: Path, split: str = "test") -> dict:
    """Zero-shot retrieval of the offline scorer and of ConSE, from the same two models."""
    import torch

    from lait.scoring.concepts import ConceptScorer
    from lait.scoring.config import ScoreConfig
    from lait.scoring.decode import ImageDecoder
    from lait.scoring.model import load_scorer
    from lait.train.evaluate import recall_at_k

    torch.set_num_threads(2)
    items = split_items(split)
    t0 = time.process_time()
    scorer: ConceptScorer = load_scorer(ScoreConfig(model="imagenet-concepts", device="cpu"))
    load_s = time.process_time() - t0
    decoder = ImageDecoder(scorer.preprocess_cfg)
    batches = [decoder([(it["filename"], (DATA / "images" / it["filename"]).read_bytes()) for it in items[i:i + 64]])
               for i in range(0, len(items), 64)]
    t0 = time.process_time()
    embs = [scorer.encode_images(batch.pixels) for batch in batches]
    image_s = (time.process_time() - t0) / len(items)  # the model's CPU time, decoding aside
    conse = []
    for batch in batches:
        with torch.inference_mode():  # ConSE: top-5 probabilities at temperature 1, no centring
            x = torch.from_numpy(batch.pixels).permute(0, 3, 1, 2).float().div_(255.0)
            clf = scorer.classifier
            p = torch.softmax(clf.classify(clf.feature_map(clf.normalise(x)).mean((2, 3))), -1)
            top = torch.topk(p, 5, dim=-1)
            w = torch.zeros_like(p).scatter_(1, top.indices, top.values)
            conse.append(torch.nn.functional.normalize(w @ scorer.prompts, dim=-1).numpy())
    texts = [s["raw"] for it in items for s in it["sentences"]]
    owner = np.array([k for k, it in enumerate(items) for _ in it["sentences"]])
    t0 = time.process_time()
    t = scorer.encode_texts(texts)
    text_s = (time.process_time() - t0) / len(texts)
    out = {}
    for name, img in (("imagenet-concepts", np.concatenate(embs)), ("conse-top5", np.concatenate(conse))):
        s = img @ t.T
        out[name] = recall_at_k(s, s, owner)
    out["cost"] = {"load_cpu_s": load_s, "cpu_s_per_image": image_s, "cpu_s_per_text": text_s,
                   "images": len(items), "texts": len(texts), "threads": 2}
    return out


def step_shards(work: Path, max_regions: int, per_shard: int = 800) -> None:
    """Train split -> shards/NNNNN.tar, one sample per caption, with cnn regions and labels."""
    import torch

    from kit.photo_shards import photo_samples, write_photo_shards

    torch.set_num_threads(2)
    samples = photo_samples(DATA / "karpathy.json", DATA / "images", "train", max_regions)
    paths = write_photo_shards(work / "shards", samples, per_shard)
    print(f"shards: {len(samples)} samples in {len(paths)} shards", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="folder for shards, runs and results")
    ap.add_argument("--only", choices=["scorer", "shards", "pretrain", "finetune", "eval"], action="append")
    ap.add_argument("--pretrain-steps", type=int, default=300)
    ap.add_argument("--finetune-steps", type=int, default=40)
    ap.add_argument("--full-limit", type=int, default=100, help="full mode scores the first N photos' pairs")
    ap.add_argument("--split", default="test", choices=["val", "test"],
                    help="the split evaluated: val to choose settings, test once for the chosen ones")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"],
                    help="autocast of training and evaluation (bf16: about twice as fast on CPUs with AVX-512 BF16)")
    ap.add_argument("--shortlist-k", type=int, default=10)
    ap.add_argument("--shortlist-itm-weight", type=float, default=0.3,
                    help="shortlist mode ranks by the contrastive logit plus this weight times the ITM margin "
                         "(chosen on val from the sweep in the shortlist output: docs/learning.md)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--regions", type=int, default=16,
                    help="regions per photo: the 7 x 7 feature map average-pooled to the largest grid that fits "
                         "(16: 4 x 4); fewer regions make the cross-encoder's pairs cheaper on a CPU")
    ap.add_argument("--modes", nargs="+", default=["embedding", "shortlist", "full", "itm"],
                    choices=["embedding", "shortlist", "full", "itm"],
                    help="evaluation modes to run (the pretrained checkpoint: embedding and itm only)")
    ap.add_argument("--checkpoints", nargs="+", default=["pretrained", "finetuned"],
                    choices=["pretrained", "finetuned"], help="checkpoints to evaluate")
    ap.add_argument("--data", type=Path, default=DATA, help="the Flickr8k folder (karpathy.json, images/)")
    args = ap.parse_args()
    from lait.train.runtime import keep_freed_memory

    keep_freed_memory()  # the shards step runs the CNN here (the lait commands call it themselves)
    set_data(args.data)
    if not (DATA / "karpathy.json").is_file():
        sys.exit(f"{DATA} is missing: this bench needs the shared Flickr8k split")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    results_path = work / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    steps = args.only or ["scorer", "shards", "pretrain", "finetune", "eval"]

    def save():
        results_path.write_text(json.dumps(results, indent=2))

    if "scorer" in steps and "scorer" not in results:
        results["scorer"] = step_scorer(work, args.split)
        save()
    if "shards" in steps and not (work / "shards" / "sizes.json").is_file():
        step_shards(work, args.regions)
    threads = str(args.threads)
    pre_ckpt = work / "pretrain" / "checkpoints" / "stage-1-flickr8k-itc.pt"
    ft_ckpt = work / "finetune" / "checkpoints" / "stage-0-finetune.pt"
    if "pretrain" in steps and not pre_ckpt.is_file():
        results["pretrain_cpu_s"] = lait(
            "train", "pretrain", "--config", str(HERE / "pretrain-flickr8k.yaml"),
            "--set", f"output_dir={work / 'pretrain'}", "--set", f"stages.0.shards={work / 'shards'}", "--set", f"stages.1.shards={work / 'shards'}",
            "--set", f"stages.0.steps={args.pretrain_steps}", "--set", f"data.regions.max_regions={args.regions}", "--set", f"cpu_threads={threads}",
            "--set", f"precision={args.precision}")
        save()
    if "finetune" in steps and not ft_ckpt.is_file():
        results["finetune_cpu_s"] = lait(
            "train", "finetune", "--config", str(HERE / "finetune-flickr8k.yaml"),
            "--set", f"output_dir={work / 'finetune'}", "--set", f"init_from={pre_ckpt}",
            "--set", f"stage.shards={work / 'shards'}", "--set", f"stage.steps={args.finetune_steps}", "--set", f"data.regions.max_regions={args.regions}",
            "--set", f"cpu_threads={threads}", "--set", f"precision={args.precision}")
        save()
    if "eval" in steps:
        for tag, ckpt in (("pretrained", pre_ckpt), ("finetuned", ft_ckpt)):
            if tag not in args.checkpoints:
                continue
            for mode, extra in (("embedding", ["--mode", "embedding"]),
                                ("shortlist", ["--mode", "shortlist", "--shortlist-k", str(args.shortlist_k),
                                               "--set", f"shortlist_itm_weight={args.shortlist_itm_weight}"]),
                                ("full", ["--mode", "full", "--limit", str(args.full_limit)]),
                                ("itm", ["--mode", "itm"])):
                key = f"eval_{tag}_{mode}"
                if key in results or mode not in args.modes or (tag == "pretrained" and mode in ("shortlist", "full")):
                    continue
                out = work / f"{key}.json"
                cpu = lait("train", "eval", "--checkpoint", str(ckpt), "--karpathy-json", str(DATA / "karpathy.json"),
                           "--image-root", str(DATA / "images"), "--split", args.split, *extra, "--set", f"precision={args.precision}", "--set", "data.regions.source=cnn",
                           "--set", f"data.regions.max_regions={args.regions}", "--set", "data.num_workers=0",
                           "--cpu-threads", threads, "--output", str(out))
                results[key] = {**json.loads(out.read_text()), "cpu_s": cpu}
                save()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
