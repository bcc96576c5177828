"""Two gloo processes under torchrun: training runs and both ranks end with identical weights."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import torch

SCRIPT = textwrap.dedent(
    """
    import os, sys, torch
    from lait.train import loop
    from lait.app.train import main

    run = loop.Trainer.run

    def run_and_dump(self, *a, **k):
        out = run(self, *a, **k)
        torch.save({n: p.detach().clone() for n, p in self.model.state_dict().items()},
                   os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.pt"))
        return out

    loop.Trainer.run = run_and_dump
    sys.exit(main(sys.argv[2:]))
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_gloo_ddp(tmp_path, object_shards, minilm_dir, pretrain_args, repo_root):
    script = tmp_path / "ddp_run.py"
    script.write_text(SCRIPT)
    out = tmp_path / "ddp"
    out.mkdir()
    args = pretrain_args(out, object_shards, minilm_dir, steps=4, extra=["--set", "checkpoint_every=2"])
    env = {**os.environ, "PYTHONPATH": str(repo_root), "OMP_NUM_THREADS": "1"}
    # --log-dir: torchrun's default is a /tmp/torchelastic_* folder it never removes.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", f"--log-dir={tmp_path / 'torchrun-logs'}", str(script), str(out), *args]
    proc = subprocess.run(cmd, env=env, cwd=repo_root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0 = torch.load(out / "rank0.pt", weights_only=True)
    r1 = torch.load(out / "rank1.pt", weights_only=True)
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
    ck = torch.load(out / "checkpoints" / "stage-0-s0.pt", weights_only=True)
    assert ck["position"]["world_size"] == 2 and len(ck["rng"]) == 2
    assert (out / "log.jsonl").read_text().count("\n") == 1  # rank 0 only, log_every=5 -> the last step
