"""One cell of `lait compare`: train a fixed budget on a selection's shards, then evaluate retrieval.

DataComp's way of judging a selection: the model, the steps, the batch size, the initialisation
and the seed are the same for every selection, only the training samples differ, and the
evaluation set is the same held-out one. The budget is a pretraining config (a YAML file as
`lait train pretrain --config` reads, by default `train/configs/compare-tiny.yaml`) whose stages'
shards are replaced by the selection's; the seed seeds the initialisation and the data order.

A cell is resumable. Its folder holds `fingerprint.json` (a digest of the budget, the seed, the
content of the selection's shards, the evaluation set and the evaluation settings) and, once
finished, `result.json` carrying the same digest: a rerun with the same inputs returns that
result without training; a changed input trains the cell again from scratch; an interrupted
training continues from its last checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lait.config import ConfigError, apply_override

log = logging.getLogger(__name__)

DEFAULT_BUDGET = Path(__file__).with_name("configs") / "compare-tiny.yaml"
METRICS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10")
RESULT_FILE = "result.json"
FINGERPRINT_FILE = "fingerprint.json"
# Settings that say how a run goes, not what it learns: left out of a cell's fingerprint.
RUN_SETTINGS = ("output_dir", "log_every", "checkpoint_every", "keep_checkpoints", "resume", "tensorboard",
                "cpu_threads", "peak_flops", "device", "precision", "progress")


@dataclass
class EvalSpec:
    """The evaluation set: a shard folder (one caption per image) or a Karpathy-style JSON."""

    source: str
    split: str = "test"
    image_root: str = ""
    mode: str = "embedding"

    @property
    def is_karpathy(self) -> bool:
        return self.source.endswith(".json")

    def root(self) -> str:
        return self.image_root or str(Path(self.source).parent)

    def check(self) -> None:
        if not self.source:
            raise ConfigError("--eval is required: a shard folder or a Karpathy-style JSON")
        if not Path(self.source).exists():
            raise ConfigError(f"--eval {self.source}: not found")
        if self.is_karpathy:
            images = self.items()
            if not images:
                raise ConfigError(f"--eval {self.source}: no image of split {self.split!r}")
            missing = [i for i in images if not (Path(self.root()) / i).is_file()]
            if missing:
                raise ConfigError(f"--eval {self.source}: image {missing[0]} not found under {self.root()} "
                                  f"({len(missing)} missing; --eval-image-root names their folder)")

    def items(self) -> list[str]:
        """The image paths of the split, relative to the image root."""
        try:
            data = json.loads(Path(self.source).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--eval {self.source}: not a readable Karpathy-style JSON ({exc})") from None
        return [str(Path(it.get("filepath", "")) / it["filename"]) for it in data.get("images", [])
                if not self.split or it.get("split", self.split) == self.split]

    def digest(self) -> str:
        """What the evaluation reads: the JSON and the split's images, or the shards, by content."""
        h = hashlib.sha256(json.dumps({"split": self.split, "mode": self.mode}).encode())
        if self.is_karpathy:
            h.update(Path(self.source).read_bytes())
            for rel in self.items():
                h.update(rel.encode() + b"\0" + file_digest(Path(self.root()) / rel).encode())
        else:
            for name, d in shard_digests(self.source).items():
                h.update(f"{name}:{d}".encode())
        return h.hexdigest()


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def shard_digests(folder: str | Path) -> dict[str, str]:
    """SHA-256 of every tar of a shard folder (and of its sizes.json), by file name."""
    folder = Path(folder)
    tars = sorted(folder.glob("*.tar"))
    if not tars:
        raise ConfigError(f"{folder}: no shards (*.tar)")
    out = {p.name: file_digest(p) for p in tars}
    if (folder / "sizes.json").is_file():
        out["sizes.json"] = file_digest(folder / "sizes.json")
    return out


def load_budget(path: str | Path, shards: str, seed: int, run_dir: Path, overrides: list[str] = ()):
    """The pretraining config of a cell: the budget file, `overrides` (`stages.0.steps=300`), and
    every stage trained on `shards` with `seed`, into `run_dir/train`."""
    from lait.train.config import PretrainConfig

    data = PretrainConfig.load_yaml(path)
    for assignment in overrides:
        apply_override(data, assignment)
    stages = data.get("stages")
    if not isinstance(stages, list) or not stages:
        raise ConfigError(f"{path}: the budget needs a list `stages`")
    for stage in stages:
        if not isinstance(stage, dict):
            raise ConfigError(f"{path}: each stage is a mapping")
        if stage.get("steps") is None:
            # Epochs would give a larger selection more steps: a budget fixes the steps.
            raise ConfigError(f"{path}: stage {stage.get('name', '?')} needs `steps`, so that every selection "
                              "trains the same number of steps")
        stage["shards"] = str(shards)
    data.update(seed=seed, output_dir=str(run_dir / "train"))
    cfg = PretrainConfig.from_dict(data, where=str(path))
    cfg.validate()
    return cfg


def fingerprint(cfg, shards: str, eval_spec: EvalSpec, eval_digest: str) -> str:
    content = {k: v for k, v in cfg.to_dict().items() if k not in RUN_SETTINGS}
    for stage in content["stages"]:
        stage["shards"] = None  # the shards count by their content, below
    what = {"budget": content, "shards": shard_digests(shards), "eval": eval_digest, "eval_mode": eval_spec.mode}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def finished(run_dir: Path, digest: str) -> dict | None:
    """The result of an earlier run of this very cell, or None."""
    p = run_dir / RESULT_FILE
    if not p.is_file():
        return None
    try:
        result = json.loads(p.read_text())
    except ValueError:
        return None
    return result if result.get("fingerprint") == digest else None


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def train_and_evaluate(shards: str, run_dir: str | Path, seed: int, eval_spec: EvalSpec, budget: str | Path = "",
                       overrides: list[str] = (), eval_digest: str | None = None,
                       cpu_threads: int | None = None, progress: bool = True) -> dict:
    """Train the budget on `shards` with `seed` and evaluate on `eval_spec`; the result (its R@K,
    its fingerprint, `trained`: whether this call trained) is also in `run_dir/result.json`."""
    from lait.train.evaluate import run_eval
    from lait.train.pretrain import run_pretrain

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = load_budget(budget or DEFAULT_BUDGET, shards, seed, run_dir, list(overrides))
    if cpu_threads:
        cfg.cpu_threads = cpu_threads
    cfg.progress = progress
    eval_digest = eval_digest or eval_spec.digest()
    digest = fingerprint(cfg, shards, eval_spec, eval_digest)
    done = finished(run_dir, digest)
    if done is not None:
        return {**done, "trained": False}
    fp_file = run_dir / FINGERPRINT_FILE
    started = json.loads(fp_file.read_text()).get("fingerprint") if fp_file.is_file() else None
    if started != digest:  # another cell's leftovers (changed inputs): start afresh
        shutil.rmtree(run_dir / "train", ignore_errors=True)
        (run_dir / RESULT_FILE).unlink(missing_ok=True)
        _write_json(fp_file, {"fingerprint": digest})
    else:
        cfg.resume = "auto"  # the same cell, interrupted: continue from its last checkpoint
    t0 = time.perf_counter()
    run_pretrain(cfg)
    train_s = time.perf_counter() - t0
    last = cfg.stages[-1]
    checkpoint = run_dir / "train" / "checkpoints" / f"stage-{len(cfg.stages) - 1}-{last.name}.pt"
    if not checkpoint.is_file():
        raise RuntimeError(f"training ended without its checkpoint {checkpoint}")
    metrics = run_eval(eval_config(checkpoint, eval_spec, run_dir, cfg.device, cfg.cpu_threads, progress))
    result = {"fingerprint": digest, "seed": seed, "shards": str(shards), "steps": sum(s.steps for s in cfg.stages),
              "batch_size": [s.batch_size for s in cfg.stages], "eval_mode": metrics["mode"],
              "eval_images": metrics["images"], "eval_texts": metrics["texts"],
              **{m: metrics[m] for m in METRICS}, "train_seconds": round(train_s, 1),
              "eval_seconds": round(metrics["seconds"], 1)}
    _write_json(run_dir / RESULT_FILE, result)
    return {**result, "trained": True}


def eval_config(checkpoint: Path, spec: EvalSpec, run_dir: Path, device: str, cpu_threads: int | None,
                progress: bool = True):
    from lait.train.config import EvalConfig

    cfg = EvalConfig(checkpoint=str(checkpoint), mode=spec.mode, cpu_threads=cpu_threads,
                     output=str(run_dir / "eval.json"), device=device, progress=progress)
    if spec.is_karpathy:
        cfg.karpathy_json, cfg.image_root, cfg.split = spec.source, spec.root(), spec.split
    else:
        cfg.shards = spec.source
    return cfg


def summarise(cells: list[dict]) -> dict[str, dict[str, float]]:
    """Mean and spread (the sample standard deviation; 0 for one seed) of each R@K over cells."""
    out = {}
    for m in METRICS:
        values = [float(c[m]) for c in cells]
        mean = sum(values) / len(values)
        spread = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        out[m] = {"mean": mean, "std": spread, "min": min(values), "max": max(values)}
    return out


__all__ = ["DEFAULT_BUDGET", "EvalSpec", "METRICS", "load_budget", "summarise", "train_and_evaluate"]
