"""Atomic checkpoints holding everything an exact resume needs.

A checkpoint is one ``torch.save`` file (loaded back with ``weights_only=True``): model, optimiser
and scheduler states, every rank's RNG states, the stage and step, and how many batches each
rank's data stream has delivered. It is written to a temporary name and renamed, and ``latest``
is a small text file rewritten the same way, so a crash never leaves a half-written checkpoint.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import re
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lait.config import ConfigError

log = logging.getLogger(__name__)


@dataclass
class Position:
    """Where a run is: stage index, optimiser steps done in it, global step, batches consumed."""

    stage: int = 0
    step: int = 0
    global_step: int = 0
    batches: int = 0  # micro-batches this rank's stream has delivered in the current stage
    num_workers: int = 0  # the data order depends on it; resume must use the same value
    world_size: int = 1


def rng_state() -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": _np_state_to_tensors(np.random.get_state()),
        "python": _py_state_to_tensors(random.getstate()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(_np_state_from_tensors(state["numpy"]))
    random.setstate(_py_state_from_tensors(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# weights_only loading accepts tensors, numbers, strings and containers, so RNG states are stored as
# tensors rather than the numpy/tuple objects their libraries hand out.
def _np_state_to_tensors(s):
    return {"name": s[0], "keys": torch.from_numpy(s[1].astype(np.int64)), "pos": int(s[2]), "has_gauss": int(s[3]), "gauss": float(s[4])}


def _np_state_from_tensors(d):
    return (d["name"], d["keys"].numpy().astype(np.uint32), d["pos"], d["has_gauss"], d["gauss"])


def _py_state_to_tensors(s):
    return {"version": s[0], "state": torch.tensor(s[1], dtype=torch.int64), "gauss": s[2]}


def _py_state_from_tensors(d):
    return (d["version"], tuple(int(x) for x in d["state"].tolist()), d["gauss"])


def save_checkpoint(path: Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``path`` atomically (temporary file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def write_latest(ckpt_dir: Path, path: Path) -> None:
    tmp = ckpt_dir / ".latest.tmp"
    tmp.write_text(path.name)
    os.replace(tmp, ckpt_dir / "latest")


def find_latest(ckpt_dir: Path) -> Path | None:
    marker = ckpt_dir / "latest"
    if marker.is_file():
        p = ckpt_dir / marker.read_text().strip()
        if p.is_file():
            return p
    return None


# What every lait checkpoint holds (`make_payload`), as far as loading a model goes.
CHECKPOINT_KEYS = ("model", "model_config")


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """A lait checkpoint, loaded with ``weights_only=True`` (tensors and plain data, never code).

    A file that is missing, damaged, hostile or not a lait checkpoint is a ConfigError of one
    line that says which and why."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"checkpoint {path}: " + ("is a folder; give the .pt file" if p.is_dir() else "not found"))
    if p.stat().st_size == 0:
        raise ConfigError(f"checkpoint {path}: the file is empty")
    try:
        with warnings.catch_warnings():  # the safe loader's remarks on pickle protocols
            warnings.simplefilter("ignore", UserWarning)
            ck = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ConfigError(f"checkpoint {path}: refused by the safe loader (weights_only): {_cause(exc)}; "
                          "a lait checkpoint holds tensors and plain data only, so this file is damaged "
                          "or was not written by lait") from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        # what torch.load raises on truncated zips, empty files and other bytes
        raise ConfigError(f"checkpoint {path}: not a readable PyTorch checkpoint "
                          f"({type(exc).__name__}: {_cause(exc)})") from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(ck, dict) or k not in ck]
    if missing:
        raise ConfigError(f"checkpoint {path}: not a lait checkpoint (it has no {', '.join(missing)})")
    return ck


def load_weights(model: torch.nn.Module, state: Any, path: str | Path) -> None:
    """``model.load_state_dict(state)``; a checkpoint of another shape is a ConfigError."""
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        first = str(exc).strip().splitlines()
        raise ConfigError(f"checkpoint {path}: its weights do not fit the model "
                          f"({first[1].strip() if len(first) > 1 else first[0] if first else type(exc).__name__})") from None


def _cause(exc: BaseException) -> str:
    """The line of an exception's message that says what went wrong, without torch's advice."""
    advice = ("Weights only load failed", "Please file an issue", "Check the documentation", "Re-running",
              "In PyTorch")
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(advice)]
    text = (useful or lines or [repr(exc)])[-1]
    text = re.split(r"\.? (?:Please|If you|This is an internal)", text)[0].removeprefix("WeightsUnpickler error: ")
    return text if len(text) <= 200 else text[:200] + "..."


def prune(ckpt_dir: Path, keep: int) -> None:
    """Keep the newest ``keep`` step checkpoints (stage-end checkpoints are never pruned)."""
    steps = sorted(ckpt_dir.glob("step-*.pt"))
    for old in steps[: max(0, len(steps) - keep)]:
        old.unlink(missing_ok=True)


def make_payload(model_state, optimizer, scheduler, position: Position, rng_states: list, config: dict, model_config: dict) -> dict:
    return {
        "model": model_state,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "position": asdict(position),
        "rng": rng_states,  # one entry per rank
        "config": config,
        "model_config": model_config,
    }
