"""Atomic checkpoints holding everything an exact resume needs.

A checkpoint is one ``torch.save`` file (loaded back with ``weights_only=True``): model, optimiser
and scheduler states, every rank's RNG states, the stage and step, and how many batches each
rank's data stream has delivered. It is written to a temporary name and renamed, and ``latest``
is a small text file rewritten the same way, so a crash never leaves a half-written checkpoint.

A full disk must not leave one either, nor keep the disk full: a write first checks that the
folder has room for the payload (`OutOfSpace`, one line with the bytes needed and free), and a
write that fails anyway removes its temporary file. A writer killed outright (kill -9, the OOM
killer) cannot clean up, so the trainer removes such orphans when it next starts
(`remove_orphans`): the temporary name holds the writer's host and pid, and only a file whose
writer is gone is removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import random
import re
import socket
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lait import errors
from lait.config import ConfigError
from lait.lifeline import alive

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
    """Write ``payload`` to ``path`` atomically (temporary file, fsync, rename), after checking
    that the folder has room for it (`check_free_space`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    check_free_space(path, payload_bytes(payload))
    with _written_atomically(path) as tmp, open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    return path


def write_latest(ckpt_dir: Path, path: Path) -> None:
    with _written_atomically(ckpt_dir / "latest") as tmp:
        tmp.write_text(path.name)


# What a torch.save file holds beyond its tensors' bytes: the pickled structure (RNG states,
# config, optimiser hyperparameters: kilobytes) and a zip header of about 100 bytes per tensor.
_SAVE_OVERHEAD = 1 << 20
_PER_TENSOR_OVERHEAD = 256


def payload_bytes(payload: Any) -> int:
    """About how many bytes ``torch.save(payload)`` writes, never fewer: every tensor storage
    once (views and shared weights share theirs, as torch.save does), plus headroom for the
    pickle and the zip records."""
    storages: dict[tuple[str, int], int] = {}

    def walk(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            st = obj.untyped_storage()
            storages[(str(obj.device), st.data_ptr() or id(st))] = st.nbytes()
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)

    walk(payload)
    return sum(storages.values()) + _PER_TENSOR_OVERHEAD * len(storages) + _SAVE_OVERHEAD


def free_bytes(folder: Path) -> int:
    """Bytes this process may still write in ``folder`` (what ``df`` shows as available)."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def check_free_space(path: Path, needed: int) -> None:
    """`OutOfSpace` before writing ``path`` when its folder has less than ``needed`` bytes free:
    one line instead of a write that fills the disk and then fails (torch.save's zip writer
    then raises a second, unrelated error as it closes)."""
    free = free_bytes(path.parent)
    if free < needed:
        raise errors.OutOfSpace(f"cannot write checkpoint {path}: it needs {needed:,} bytes and {path.parent} "
                                f"has {free:,} free; {_RERUN}")


# A rerun without --resume would start the training over, not go on from the last checkpoint.
_RERUN = "free some space and rerun with --resume auto (the checkpoints written before are kept)"


def _out_of_space(exc: BaseException, path: Path) -> errors.OutOfSpace:
    """lait's one line for a full disk (`errors.out_of_space`: the path and the cause), ending
    with the rerun that continues a training run."""
    said = str(errors.out_of_space(exc, path)).split("; ")[0]
    return errors.OutOfSpace(f"{said}; {_RERUN}")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "localhost"


def temp_path(path: Path) -> Path:
    """The hidden temporary name ``path`` is written under: it names the writer (host and pid),
    so that a later start can tell an orphan from a file being written (`remove_orphans`)."""
    return path.with_name(f".{path.name}.tmp-{_host()}-{os.getpid()}")


@contextlib.contextmanager
def _written_atomically(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``, renamed onto it when the block ends. On any exception
    (a full disk, Ctrl-C) the temporary file is removed, and a full disk becomes `OutOfSpace`
    naming ``path``: torch.save reports ENOSPC as a RuntimeError of its zip writer, whose cause
    (``__context__``) is the OSError."""
    tmp = temp_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        full = _out_of_space_in(exc)
        if full is not None:
            raise _out_of_space(full, path) from exc
        raise


def _out_of_space_in(exc: BaseException | None) -> BaseException | None:
    """The full-disk error ``exc`` is or was raised while handling, else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if errors.is_out_of_space(exc):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


# `.NAME.tmp-HOST-PID`, or `.NAME.tmp-PID` as lait wrote it before the host was added.
_TEMP_RE = re.compile(r"^\.(?P<name>.+)\.tmp-(?:(?P<host>.+)-)?(?P<pid>\d+)$")

# A temporary file of another host's writer cannot be asked whether its writer lives; one not
# written to for this long is not being written (a checkpoint's write and fsync take minutes at most).
STALE_AFTER_S = 3600.0


def remove_orphans(ckpt_dir: Path) -> list[Path]:
    """Remove the temporary files of checkpoint writers that died before they finished (kill -9,
    the OOM killer, a lost node), which would keep their bytes on the disk forever; returns them.
    A file of a live writer on this host is never touched, nor a recent one of another host."""
    removed = []
    if not ckpt_dir.is_dir():
        return removed
    for p in ckpt_dir.iterdir():
        m = _TEMP_RE.match(p.name)
        if m is None:
            continue
        try:
            st = p.stat()
            if not p.is_file() or not _orphaned(st, m["host"], int(m["pid"])):
                continue
            p.unlink()
        except FileNotFoundError:  # its writer finished (renamed it) meanwhile
            continue
        log.warning("checkpoint/orphan_removed %s (%d bytes, left by a writer that died: pid %s on %s)",
                    p, st.st_size, m["pid"], m["host"] or _host())
        removed.append(p)
    return removed


def _orphaned(st: os.stat_result, host: str | None, pid: int) -> bool:
    if host is None or host == _host():
        return pid != os.getpid() and not alive(pid)
    return time.time() - st.st_mtime > STALE_AFTER_S


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
