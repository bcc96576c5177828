"""Pretraining on shards: all four losses learn, resume is exact, stages chain, CLI works."""

from __future__ import annotations

import json
import math

import torch

from lait.app.train import main


def _records(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_four_losses_finite_and_decreasing(tmp_path, object_shards, minilm_dir, pretrain_args):
    out = tmp_path / "run"
    assert main(pretrain_args(out, object_shards, minilm_dir, steps=60)) == 0
    logs = _records(out)
    for task in ("mlm", "moc", "mrfr", "itm"):
        values = [r[task] for r in logs]
        assert all(math.isfinite(v) for v in values), task
        first, last = sum(values[:2]) / 2, sum(values[-2:]) / 2
        assert last < first, f"{task}: {values}"
    assert {"samples_per_s", "tokens_per_s", "data_wait_share", "lr"} <= set(logs[-1])
    assert (out / "config.yaml").is_file()
    assert (out / "checkpoints" / "stage-0-s0.pt").is_file()


def _losses_by_step(out):
    return {r["global_step"]: (r["loss"], r["mlm"], r["moc"], r["mrfr"], r["itm"]) for r in _records(out)}


import pytest  # noqa: E402


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_reproduces_uninterrupted_run(object_shards, minilm_dir, pretrain_args, full_and_crashed, workers):
    common = ["--set", "log_every=1", "--set", "checkpoint_every=6", "--set", f"data.num_workers={workers}"]
    full, crashed = full_and_crashed(common)  # the second crashed after step 8, its last checkpoint step 6's
    assert main(pretrain_args(crashed, object_shards, minilm_dir, steps=12, extra=[*common, "--resume", "auto"])) == 0

    reference, resumed = _losses_by_step(full), _losses_by_step(crashed)  # resumed steps overwrite 7-8
    assert sorted(resumed) == list(range(1, 13))
    for step in range(7, 13):
        assert resumed[step] == reference[step], step  # exact, not approximately equal
    a = torch.load(full / "checkpoints" / "stage-0-s0.pt", weights_only=True)["model"]
    b = torch.load(crashed / "checkpoints" / "stage-0-s0.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_two_stages_chain_weights(tmp_path, object_shards, minilm_dir, pretrain_args):
    out = tmp_path / "two"
    stages = (f"[{{name: web, shards: '{object_shards}', steps: 4, batch_size: 8, optim: {{lr: 1.0e-3}}}},"
              f" {{name: indomain, shards: '{object_shards}/{{00000..00001}}.tar', steps: 3, batch_size: 8,"
              f" optim: {{lr: 5.0e-4}}, tasks: {{moc: 0.0, mrfr: 0.0}}}}]")
    assert main(pretrain_args(out, object_shards, minilm_dir, extra=["--set", f"stages={stages}", "--set", "log_every=1"])) == 0
    logs = _records(out)
    assert [(r["stage_name"], r["global_step"]) for r in logs] == [("web", i) for i in range(1, 5)] + [("indomain", i) for i in range(5, 8)]
    assert "moc" not in logs[-1] and "mlm" in logs[-1]
    assert logs[-3]["lr"] <= 5.0e-4 + 1e-12
    ck = torch.load(out / "checkpoints" / "stage-1-indomain.pt", weights_only=True)
    assert ck["position"]["global_step"] == 7


def test_itc_task_learns_alignment(tmp_path, object_shards, minilm_dir, pretrain_args):
    """``tasks.itc`` (off by default) adds the unimodal contrastive loss, which must go down."""
    out = tmp_path / "itc"
    args = pretrain_args(out, object_shards, minilm_dir, steps=40)
    i = args.index(next(a for a in args if a.startswith("stages=")))
    args[i] = args[i].replace("optim: {lr: 3.0e-3, warmup_steps: 2, schedule: constant}}",
                              "optim: {lr: 3.0e-3, warmup_steps: 2, schedule: constant}, tasks: {itc: 1.0}}")
    assert "itc: 1.0" in args[i]
    assert main(args) == 0
    values = [r["itc"] for r in _records(out)]
    assert all(math.isfinite(v) for v in values)
    assert sum(values[-3:]) / 3 < sum(values[:3]) / 3, values


def test_no_progress_silences_the_training_bar(tmp_path, object_shards, minilm_dir, pretrain_args, capfd, monkeypatch):
    """`lait compare --no-progress` passes `progress: false` to the trainer; a bar forced on
    (LAIT_PROGRESS=1: stderr is not a terminal here) is drawn only when progress is on."""
    monkeypatch.setenv("LAIT_PROGRESS", "1")
    assert main(pretrain_args(tmp_path / "on", object_shards, minilm_dir, steps=4)) == 0
    assert "s0: 100%" in capfd.readouterr().err
    assert main(pretrain_args(tmp_path / "off", object_shards, minilm_dir, steps=4,
                              extra=["--set", "progress=false"])) == 0
    assert "s0:" not in capfd.readouterr().err
