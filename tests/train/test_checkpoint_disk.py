"""Issue 59, row 5: a checkpoint that met a full disk ended the run with two tracebacks (ENOSPC,
then torch's zip writer: `inline_container.cc ... unexpected pos`) and left its temporary file
(139 MB there) behind, so the disk stayed full; a writer killed during the write left one too.
Now the free space is checked before writing (one line with the bytes needed and free), a failed
write removes its temporary file, a full disk ends the run with one line and exit 1, and the
next start removes what a killed writer left, never a live writer's file.

The full-disk tests write into a small tmpfs mounted for them (root only, as
tests/lait/test_disk_full.py does; skipped elsewhere)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kit.disks import mounted_tmpfs
from lait import errors
from lait.train import checkpoint

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def tmpfs(tmp_path_factory):
    yield from mounted_tmpfs(tmp_path_factory, 48)


def fill(mnt: Path, leave: int) -> Path:
    """A filler file that takes all but `leave` bytes of the tmpfs."""
    filler = mnt / "filler"
    todo = max(0, checkpoint.free_bytes(mnt) - leave)
    with open(filler, "wb") as f:
        while todo > 0:
            n = min(todo, 1 << 20)
            f.write(b"\0" * n)
            todo -= n
    return filler


def lait(argv: list[str], patch: str = "") -> subprocess.CompletedProcess:
    """`lait ARGV` in a new process; `patch`: Python run first (in that process)."""
    code = f"import sys\n{patch}\nfrom lait.app.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def complaints(stderr: str) -> list[str]:
    """stderr less the INFO lines a training run logs as it goes."""
    return [line for line in stderr.splitlines() if line.strip() and " INFO " not in line]


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp" in p.name) if folder.is_dir() else []


def test_a_checkpoint_that_does_not_fit_stops_the_run_before_writing_with_one_line(
        tmpfs, object_shards, minilm_dir, pretrain_args):
    out = tmpfs / "run"
    argv = ["train", *pretrain_args(out, object_shards, minilm_dir, steps=6, extra=["--set", "checkpoint_every=3"])]
    filler = fill(tmpfs, leave=4 << 20)  # room for the logs, not for a 25 MB checkpoint
    try:
        full = lait(argv)
        free_after = checkpoint.free_bytes(tmpfs)
    finally:
        filler.unlink()
    assert full.returncode == 1, full.stderr[-3000:]
    assert "Traceback" not in full.stderr
    (line,) = complaints(full.stderr)
    folder = out / "checkpoints"
    where = re.escape(str(folder))
    said = re.fullmatch(rf"lait train: cannot write checkpoint {where}/step-00000003\.pt: it needs ([\d,]+) bytes "
                        rf"and {where} has ([\d,]+) free; free some space and rerun with --resume auto "
                        r"\(the checkpoints written before are kept\)", line)
    assert said, line
    needed, free = (int(x.replace(",", "")) for x in said.groups())
    assert needed > 20 << 20 and 0 < free < 4 << 20
    assert free_after > 3 << 20  # nothing was written: the disk was not filled
    assert temporaries(folder) == []
    again = lait([*argv, "--resume", "auto"])  # space freed: the same command finishes
    assert again.returncode == 0, again.stderr[-3000:]
    assert (folder / "stage-0-s0.pt").is_file() and temporaries(folder) == []


def test_a_disk_that_fills_during_the_write_ends_with_one_line_and_keeps_no_temporary_file(
        tmpfs, object_shards, minilm_dir, pretrain_args):
    """The check passes (another process takes the space after it, say), then torch.save meets
    ENOSPC: one line naming the checkpoint, exit 1, and the disk as free as before the write."""
    out = tmpfs / "run-2"
    argv = ["train", *pretrain_args(out, object_shards, minilm_dir, steps=6, extra=["--set", "checkpoint_every=3"])]
    claims_room = "import lait.train.checkpoint as c\nc.free_bytes = lambda folder: 1 << 40"
    filler = fill(tmpfs, leave=6 << 20)
    try:
        full = lait(argv, patch=claims_room)
        free_after = checkpoint.free_bytes(tmpfs)
    finally:
        filler.unlink()
    assert full.returncode == 1, full.stderr[-3000:]
    assert "Traceback" not in full.stderr and "inline_container" not in full.stderr
    assert complaints(full.stderr) == [f"lait train: cannot write {out}/checkpoints/step-00000003.pt: no space left "
                                       "on device; free some space and rerun with --resume auto (the checkpoints "
                                       "written before are kept)"]
    assert temporaries(out / "checkpoints") == []
    assert free_after > 5 << 20  # the partial file's bytes are free again


def test_a_refused_checkpoint_names_the_folder_the_bytes_needed_and_free(tmp_path, monkeypatch):
    """Without a tmpfs too: the check, and that it comes before anything is written."""
    monkeypatch.setattr(checkpoint, "free_bytes", lambda folder: 123_456)
    path = tmp_path / "ck" / "step-00000010.pt"
    payload = {"model": {"w": torch.zeros(1 << 20)}}
    with pytest.raises(errors.OutOfSpace) as got:
        checkpoint.save_checkpoint(path, payload)
    needed = checkpoint.payload_bytes(payload)
    assert str(got.value) == (f"cannot write checkpoint {path}: it needs {needed:,} bytes and {path.parent} has "
                              "123,456 free; free some space and rerun with --resume auto (the checkpoints "
                              "written before are kept)")
    assert errors.user_error(got.value) == str(got.value)  # the command line prints it as it is
    assert list(path.parent.iterdir()) == []


def test_the_space_a_checkpoint_needs_is_never_less_than_what_it_writes(tmp_path):
    from lait.train.model import ImageBert, ImageBertConfig

    model = ImageBert(ImageBertConfig.named("imagebert-tiny"))
    opt = torch.optim.AdamW(model.parameters())
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # the optimiser's two moments per weight
    state = model.state_dict()
    # The same tensors twice and a view of one: torch.save writes each storage once.
    payload = {"model": state, "optimizer": opt.state_dict(), "again": state, "view": next(iter(state.values()))[:1]}
    path = checkpoint.save_checkpoint(tmp_path / "x.pt", payload)
    written, estimate = path.stat().st_size, checkpoint.payload_bytes(payload)
    assert written <= estimate <= written + (2 << 20)


# A checkpoint writer that stops in the middle of its write, as a large one spends seconds there:
# it writes 4 MB under save_checkpoint's own temporary name, says so, and waits.
SLOW_WRITER = """
import sys, time
from pathlib import Path
import torch
from lait.train import checkpoint

def stuck(payload, f):
    f.write(bytes(4 << 20))
    f.flush()
    print("writing", flush=True)
    time.sleep(600)

checkpoint.torch.save = stuck
checkpoint.save_checkpoint(Path(sys.argv[1]), {"model": torch.zeros(1)})
"""


def writer_in_the_middle(path: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    return proc


def _records(out: Path) -> dict[int, tuple]:
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return {r["global_step"]: (r["loss"], r["mlm"], r["moc"], r["mrfr"], r["itm"]) for r in rows}


def test_a_killed_writers_orphan_goes_on_the_next_start_a_live_writers_stays_and_resume_is_exact(
        tmp_path, object_shards, minilm_dir, pretrain_args, full_and_crashed, caplog):
    from lait.app.train import main

    common = ["--set", "log_every=1", "--set", "checkpoint_every=6"]
    full, crashed = full_and_crashed(common)  # the second died after step 8; its last checkpoint is step 6's

    ckpts = crashed / "checkpoints"
    killed = writer_in_the_middle(ckpts / "step-00000012.pt")
    killed.kill()  # kill -9 in the middle of the write
    killed.wait()
    orphan = checkpoint.temp_path(ckpts / "step-00000012.pt").name.replace(f"-{os.getpid()}", f"-{killed.pid}")
    assert (ckpts / orphan).stat().st_size == 4 << 20
    old_style = ckpts / f".step-00000009.pt.tmp-{killed.pid}"  # as lait named them before (issue 59)
    old_style.write_bytes(bytes(1 << 20))
    elsewhere_recent = ckpts / ".step-00000010.pt.tmp-otherhost-4242"  # a writer on another machine
    elsewhere_recent.write_bytes(b"x")
    elsewhere_stale = ckpts / ".step-00000011.pt.tmp-otherhost-4243"
    elsewhere_stale.write_bytes(b"x")
    hours_ago = time.time() - 3 * checkpoint.STALE_AFTER_S
    os.utime(elsewhere_stale, (hours_ago, hours_ago))
    live = writer_in_the_middle(ckpts / "step-00000099.pt")
    try:
        writing = checkpoint.temp_path(ckpts / "step-00000099.pt").name.replace(f"-{os.getpid()}", f"-{live.pid}")
        assert (ckpts / writing).is_file()
        with caplog.at_level(logging.WARNING, logger="lait.train.checkpoint"):
            assert main(pretrain_args(crashed, object_shards, minilm_dir, steps=12,
                                      extra=[*common, "--resume", "auto"])) == 0
        assert (ckpts / writing).is_file()  # its writer lives: never touched
    finally:
        live.kill()
        live.wait()
    left = {p.name for p in ckpts.iterdir()}
    assert {orphan, old_style.name, elsewhere_stale.name}.isdisjoint(left)
    assert {elsewhere_recent.name, writing, "step-00000006.pt", "stage-0-s0.pt", "latest"} <= left
    removed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("checkpoint/orphan_removed")]
    assert len(removed) == 3 and any(f"{orphan} (4194304 bytes" in m for m in removed), removed

    reference, resumed = _records(full), _records(crashed)
    assert sorted(resumed) == list(range(1, 13))
    for step in range(7, 13):
        assert resumed[step] == reference[step], step  # exact, not approximately equal
    a = torch.load(full / "checkpoints" / "stage-0-s0.pt", weights_only=True)["model"]
    b = torch.load(ckpts / "stage-0-s0.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
