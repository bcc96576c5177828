"""The trainer's speed work (issue 46) changes no result it was not meant to change.

- Losses on a fixed seed equal those recorded before it (main at 9aefb50, by the same runs:
  `tests/train/data/pretrain_losses_9aefb50.json`): reading losses one step late, host-found
  loss positions, fp16 region features to the device.
- Length bucketing (`data.length_buckets`) pads less, keeps every sample, and resumes exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lait.app.train import main
from lait.train.batch import IGNORE, Example, SpecialTokens, collate

GOLDEN = Path(__file__).parent / "data" / "pretrain_losses_9aefb50.json"
RUNS = {"default": [], "wide_regions": ["--set", "data.regions.max_regions=16"],
        "itc": ["--set", "stages.0.tasks.itc=0.5"]}


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_losses_on_a_fixed_seed_equal_the_ones_before(tmp_path, object_shards, minilm_dir, pretrain_args, name):
    gold = json.loads(GOLDEN.read_text())[name]
    out = tmp_path / name
    assert main(pretrain_args(out, object_shards, minilm_dir, steps=10, extra=["--set", "log_every=1", *RUNS[name]])) == 0
    got = _records(out)
    assert [r["global_step"] for r in got] == [g["global_step"] for g in gold] == list(range(1, 11))
    for r, g in zip(got, gold):
        for key, value in g.items():
            assert r[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (r["global_step"], key)


def _special() -> SpecialTokens:
    return SpecialTokens(cls=101, sep=102, mask=103, pad=0, vocab_size=1000)


def _examples(n: int, seed: int = 0, dim: int = 8) -> list[Example]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(1, 30))
        out.append(Example(f"{i}", list(rng.integers(1000, 2000, int(rng.integers(2, 30)))),
                           regions=rng.normal(size=(k, dim)).astype(np.float16),
                           boxes=np.tile([0.1, 0.1, 0.5, 0.5], (k, 1)).astype(np.float32),
                           labels=rng.integers(0, 5, k)))
    return out


def test_host_found_positions_select_what_the_masks_select():
    """The losses read rows by the flat positions `collate` finds: the same rows, in the same
    order, as boolean indexing by the masks."""
    b = collate(_examples(16), _special(), max_text_len=40, max_regions=36, generator=torch.Generator().manual_seed(3),
                itm_negative_prob=0.5)
    assert b.region_features.dtype == torch.float16  # as stored in the shards
    x = torch.randn(*b.mlm_labels.shape, 4)
    flat = x.reshape(-1, 4)
    assert torch.equal(flat[b.mlm_index], x[b.mlm_labels != IGNORE]) and len(b.mlm_index) > 0
    r = torch.randn(*b.region_masked.shape, 4)
    assert torch.equal(r.reshape(-1, 4)[b.region_index], r[b.region_masked]) and len(b.region_index) > 0
    assert torch.equal(r.reshape(-1, 4)[b.moc_index], r[b.region_masked & (b.moc_labels != IGNORE)])


def test_trimmed_regions_keep_the_same_masking():
    ex = _examples(8, seed=1)
    full = collate(ex, _special(), 40, 64, torch.Generator().manual_seed(5), itm_negative_prob=0.5)
    trim = collate(ex, _special(), 40, 64, torch.Generator().manual_seed(5), itm_negative_prob=0.5, trim_regions=True)
    w = trim.region_valid.shape[1]
    assert w < full.region_valid.shape[1] and w % 8 == 0
    assert torch.equal(trim.region_valid, full.region_valid[:, :w]) and not full.region_valid[:, w:].any()
    assert torch.equal(trim.region_masked, full.region_masked[:, :w])
    assert torch.equal(trim.region_features, full.region_features[:, :w])


def _padding(batches) -> tuple[int, int]:
    real = sum(int(b.text_mask.sum()) + int(b.region_valid.sum()) for b in batches)
    padded = sum(b.input_ids.numel() + b.region_valid.numel() for b in batches)
    return real, padded


def test_length_buckets_pad_less_and_keep_every_sample(tmp_path, minilm_dir):
    from kit.synthetic_shards import object_samples, write_shards
    from lait.train.data import Decoder, ShardStream, WordPiece

    write_shards(tmp_path, object_samples(192, seed=2, num_classes=30, max_objects=24), per_shard=64)
    urls = sorted(str(p) for p in tmp_path.glob("*.tar"))
    tok = WordPiece(minilm_dir)
    kwargs = dict(special=tok.special, max_text_len=64, max_regions=24)

    def batches(buckets: int):
        ds = ShardStream(urls, Decoder(tok, "shard", 224), 16, 0, kwargs, shuffle_buffer=1, loop=False,
                         length_buckets=buckets)
        return list(ds)

    plain, bucketed = batches(0), batches(4)
    assert sorted(k for b in plain for k in b.keys) == sorted(k for b in bucketed for k in b.keys)
    assert len({k for b in bucketed for k in b.keys}) == 192
    (real_a, pad_a), (real_b, pad_b) = _padding(plain), _padding(bucketed)
    assert real_a == real_b
    assert pad_b < 0.8 * pad_a and real_b / pad_b > 0.75, (real_a, pad_a, pad_b)  # 57 % -> 79 % here


def test_length_buckets_resume_exactly(tmp_path, object_shards, minilm_dir, pretrain_args):
    """A run resumed from its step-4 checkpoint logs the uninterrupted run's losses, bucketed."""
    common = ["--set", "log_every=1", "--set", "checkpoint_every=4", "--set", "data.length_buckets=3",
              "--set", "data.num_workers=2"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(pretrain_args(full, object_shards, minilm_dir, steps=8, extra=common)) == 0
    assert main(pretrain_args(part, object_shards, minilm_dir, steps=5, extra=common)) == 0
    # Continue the 5-step run's checkpoint at step 4 as an 8-step run.
    ckpts = part / "checkpoints"
    step4 = ckpts / "step-00000004.pt"
    assert step4.is_file()
    assert main(pretrain_args(part, object_shards, minilm_dir, steps=8, extra=[*common, "--resume", str(step4)])) == 0
    ref = {r["global_step"]: r["loss"] for r in _records(full)}
    got = {r["global_step"]: r["loss"] for r in _records(part)}
    assert all(got[s] == ref[s] for s in range(5, 9)), (got, ref)
