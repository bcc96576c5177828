"""Device, precision, distributed set-up, optimiser, schedules and the metrics logger."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lait.train.config import OptimConfig

log = logging.getLogger(__name__)

# Dense bf16 peak FLOP/s per GPU, for the MFU estimate.
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "L4": 121e12}


@dataclass
class Runtime:
    """Where this process trains: device, autocast dtype and its place in the process group."""

    device: torch.device
    dtype: torch.dtype | None  # autocast dtype, None = fp32
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def peak_flops(self, override: float | None) -> float | None:
        if override:
            return override
        if self.device.type != "cuda":
            return None
        name = torch.cuda.get_device_name(self.device)
        return next((v for k, v in PEAK_BF16.items() if k in name), None)


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed blocks instead of handing them back to the kernel.

    Each forward pass allocates and frees the same large activations (and, under autocast, a bf16
    copy of every weight). Above glibc's default thresholds each such block is a fresh mmap that
    the kernel zero-fills page by page, then an munmap: on a CPU evaluation of ImageBERT (50
    Flickr8k photos, full mode) that was 83 s of system time beside 162 s of user time, and 3.6 s
    with the thresholds raised (wall 146 s -> 84 s). The resident size stays at its peak instead.
    Returns whether the settings took (False where the C library is not glibc)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 1 << 30)) and bool(mallopt(m_trim_threshold, (1 << 31) - 1))


def setup_runtime(device: str = "auto", precision: str = "auto", cpu_threads: int | None = None) -> Runtime:
    """Pick the device and join the process group when launched by torchrun (WORLD_SIZE > 1)."""
    if cpu_threads:
        torch.set_num_threads(cpu_threads)
    keep_freed_memory()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    dev = torch.device(f"cuda:{local}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if use_cuda else "gloo")
    if precision == "auto":
        dtype = torch.bfloat16 if use_cuda else None
    else:
        dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return Runtime(dev, dtype, rank, world, local)


def start_training(cfg: Any) -> Runtime:
    """What every training run does first (pretraining and finetuning): check the config, set
    up the device and precision, and seed each rank differently."""
    cfg.validate()
    rt = setup_runtime(cfg.device, cfg.precision, cfg.cpu_threads)
    seed_everything(cfg.seed + rt.rank)
    return rt


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_optimizer(model: torch.nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW, no weight decay on biases, norms and the MLM bias (as BERT); fused on CUDA."""
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), fused=device.type == "cuda")


def make_scheduler(opt: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup, then linear or cosine decay to 0, or constant."""
    warm = max(0, cfg.warmup_steps)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warm) / max(1, total_steps - warm))
        if cfg.schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if cfg.schedule == "linear":
            return 1.0 - progress
        raise ValueError(f"unknown schedule {cfg.schedule!r} (linear | cosine | constant)")

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


class MetricLogger:
    """JSON lines (``log.jsonl``) and TensorBoard, written by rank 0 only."""

    def __init__(self, out_dir: Path, enabled: bool, tensorboard: bool):
        self.enabled = enabled
        self.file = None
        self.tb = None
        if not enabled:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        self.file = open(out_dir / "log.jsonl", "a", buffering=1)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out_dir / "tensorboard"))
            except ImportError:
                log.warning("tensorboard is not installed; logging JSON lines only (pip install tensorboard)")

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        if self.tb is not None:
            step = record.get("global_step", 0)
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "global_step" and math.isfinite(v):
                    self.tb.add_scalar(f"{record.get('stage_name', 'train')}/{k}", v, step)

    def close(self) -> None:
        if self.file:
            self.file.close()
        if self.tb:
            self.tb.close()
