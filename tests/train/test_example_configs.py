"""The configs shipped in train/configs run as shipped on the shards `lait demo` builds: the
example pretraining run from the repository root as the README says (a few steps here), and
every model config under it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "train" / "configs" / "pretrain-example.yaml"
FEW_STEPS = ["--set", "stages.0.steps=2", "--set", "stages.1.steps=2",
             "--set", "stages.0.batch_size=8", "--set", "stages.1.batch_size=8"]


@pytest.fixture
def repo_like(tmp_path, demo_run, minilm_dir):
    """A folder where `demo/` is the demo's output, as after `lait demo --out demo/` at the root."""
    out, _ = demo_run
    (tmp_path / "demo").symlink_to(out)
    return tmp_path


def pretrain(cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lait", "train", "pretrain", "--config", str(EXAMPLE), *FEW_STEPS,
                           "--set", "cpu_threads=1", *extra], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_example_pretraining_config_runs_as_shipped_after_lait_demo(repo_like):
    proc = pretrain(repo_like)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = repo_like / "runs" / "imagebert-pretrain"  # the config's own output_dir
    assert (run / "checkpoints" / "stage-0-lait-web.pt").is_file()
    assert (run / "checkpoints" / "stage-1-in-domain.pt").is_file()
    logs = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert {r["stage_name"] for r in logs} == {"lait-web", "in-domain"}
    assert all(k in logs[-1] for k in ("mlm", "mrfr", "itm")) and "moc" not in logs[-1]


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(p.stem for p in (REPO / "train" / "configs").glob("imagebert-*.yaml")))
def test_every_model_config_trains_on_the_demo_shards(model, repo_like):
    init = [] if model == "imagebert-minilm" else ["--set", "init_from=null", "--set", "data.tokenizer=minilm"]
    proc = pretrain(repo_like, "--set", f"model={model}", "--output-dir", str(repo_like / model), "--set",
                    "stages=[{name: one, shards: demo/work/shards/, steps: 1, batch_size: 2, tasks: {moc: 0.0}}]",
                    "--set", "tensorboard=false", *init)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (repo_like / model / "checkpoints" / "stage-0-one.pt").is_file()
