"""Retrieval finetuning with each loss, hard-negative mining, then ``eval`` in both modes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lait.app.train import main
from lait.train.finetune import mine_negatives


def test_hard_negatives_are_most_similar_non_matches():
    sim = torch.tensor([[0.9, 0.8, 0.1, 0.5], [0.7, 0.2, 0.6, 0.1], [0.0, 0.3, 1.0, 0.2], [0.4, 0.9, 0.3, 0.8]])
    hard = mine_negatives(sim, 2, hard=True)
    assert hard.tolist() == [[1, 3], [0, 2], [1, 3], [1, 0]]
    rand = mine_negatives(sim, 3, hard=False, generator=torch.Generator().manual_seed(0))
    assert all(i not in row for i, row in enumerate(rand.tolist()))


def test_sampled_hard_negatives_follow_the_similarity_and_never_the_match():
    """ALBEF's mining: a non-match is drawn with probability softmax(similarity / 0.05), so the
    closest is the usual pick but not the only one (it may be a true match, captioned alike)."""
    sim = torch.tensor([[0.9, 0.85, 0.8, 0.0], [0.5, 0.5, 0.5, 0.5], [0.1, 0.2, 0.9, 0.9], [0.0, 0.0, 0.0, 0.1]])
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([mine_negatives(sim, 1, hard=True, generator=g, sampled=True)[:, 0] for _ in range(2000)])
    counts = [torch.bincount(draws[:, i], minlength=4).tolist() for i in range(4)]
    assert all(c[i] == 0 for i, c in enumerate(counts))  # never the match itself
    # Row 0: e^(0.85/0.05) : e^(0.8/0.05) : e^0 = 0.73 : 0.27 : ~0.
    assert 0.68 < counts[0][1] / 2000 < 0.78 and 0.22 < counts[0][2] / 2000 < 0.32 and counts[0][3] < 10
    assert counts[2][3] / 2000 > 0.99  # the one as close as the match
    assert min(counts[1][j] for j in (0, 2, 3)) > 550  # ties: as likely as each other
    two = mine_negatives(sim, 2, hard=True, generator=g, sampled=True)
    assert all(len(set(r)) == 2 and i not in r for i, r in enumerate(two.tolist()))


def _finetune_args(out, shards, tokenizer, loss, init_from=None):
    stage = f"{{name: ft, shards: '{shards}', steps: 3, batch_size: 8, optim: {{lr: 1.0e-3}}}}"
    args = ["finetune", "--output-dir", str(out), "--device", "cpu", "--loss", loss,
            "--set", "model=imagebert-tiny", "--set", f"data.tokenizer={tokenizer}", "--set", "data.num_workers=0",
            "--set", "data.regions.max_regions=8", "--set", "log_every=1", "--set", "tensorboard=false",
            "--set", f"stage={stage}", "--set", "num_negatives=2"]
    return args + (["--init-from", str(init_from)] if init_from else [])


@pytest.mark.parametrize("loss", ["binary", "multiclass", "triplet", "multiclass+binary"])
def test_finetune_losses_run(tmp_path, object_shards, minilm_dir, loss):
    out = tmp_path / loss
    name, _, extra = loss.partition("+")
    # The last case also mines its hard negatives as ALBEF does (drawn by similarity).
    more = ["--set", "binary_weight=0.5", "--set", "hard_sampling=softmax"] if extra else []
    args = _finetune_args(out, object_shards, minilm_dir, name) + more
    assert main(args) == 0
    logs = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert len(logs) == 3 and all(torch.isfinite(torch.tensor([r["itm"], r["itc"]])).all() for r in logs)
    # The balanced match / no-match term is logged beside the multiclass loss when it is added.
    assert all(("itm_binary" in r) == bool(extra) for r in logs)
    if extra:
        assert all(r["itm_binary"] > 0 and r["itm_binary"] != r["itm"] for r in logs)


def test_pretrain_finetune_eval_pipeline(tmp_path, object_shards, minilm_dir, pretrain_args, capsys):
    pre = tmp_path / "pre"
    assert main(pretrain_args(pre, object_shards, minilm_dir, steps=3)) == 0
    ft = tmp_path / "ft"
    args = _finetune_args(ft, object_shards, minilm_dir, "multiclass", pre / "checkpoints" / "stage-0-s0.pt")
    assert main(args) == 0
    ckpt = ft / "checkpoints" / "stage-0-ft.pt"
    results = {}
    for mode in ("full", "shortlist", "embedding", "itm"):
        capsys.readouterr()
        assert main(["eval", "--checkpoint", str(ckpt), "--shards", f"{object_shards}/00000.tar", "--limit", "24",
                     "--mode", mode, "--shortlist-k", "5", "--device", "cpu", "--output", str(tmp_path / f"{mode}.json"),
                     "--set", f"scores_output={tmp_path / 'shortlist.npz'}"]) == 0
        results[mode] = json.loads((tmp_path / f"{mode}.json").read_text())
    assert results["full"]["mode"] == "full" and results["shortlist"]["mode"] == "shortlist@5"
    assert results["full"]["itm_pairs_scored"] == 24 * 24
    assert results["shortlist"]["itm_pairs_scored"] == 2 * 24 * 5
    assert results["embedding"]["mode"] == "embedding" and results["embedding"]["itm_pairs_scored"] == 0
    # The shortlist holds the embedding top 5, re-ordered within: at K = 5 both count the same hits.
    short = results["shortlist"]
    for d in ("i2t", "t2i"):
        assert short[f"{d}_r5"] == pytest.approx(results["embedding"][f"{d}_r5"])
        assert short["itm_only"][f"{d}_r5"] == pytest.approx(results["embedding"][f"{d}_r5"])
    # The headline is the summed score by default; the cross-encoder's own ranking sits beside it.
    assert short["shortlist_score"] == "sum"
    assert {k: short[k] for k in short["itm_plus_itc"]} == short["itm_plus_itc"]
    # The sweep over the margin's weight: 0 is the embeddings' own order, 1 the headline.
    sweep = short["itm_weight_sweep"]
    assert short["itm_weight"] == 1.0 and sweep["1"] == short["itm_plus_itc"]
    for k in ("i2t_r1", "t2i_r1", "i2t_r5", "t2i_r5"):
        assert sweep["0"][k] == pytest.approx(results["embedding"][k])
        assert short["itm_weight_sweep_centred"]["0"][k] == sweep["0"][k]
    # The shortlisted pairs, written for choosing a ranking offline: 24 images x 5 each way.
    saved = np.load(tmp_path / "shortlist.npz")
    assert len(saved["i2t_itm"]) == len(saved["t2i_itm"]) == 24 * 5
    assert np.isfinite(saved["i2t_cos"]).all() and saved["text_to_image"].shape == (24,)
    itm = results.pop("itm")
    assert itm["mode"] == "itm" and itm["itm_pairs_scored"] == 2 * 24
    assert 0.0 <= itm["itm_pos_acc"] <= 1.0 and 0.0 <= itm["itm_neg_acc"] <= 1.0
    assert itm["itm_acc"] == pytest.approx((itm["itm_pos_acc"] + itm["itm_neg_acc"]) / 2)
    for r in results.values():
        assert 0.0 <= r["i2t_r1"] <= r["i2t_r5"] <= r["i2t_r10"] <= 1.0
        assert abs(r["rsum"] - sum(r[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))) < 1e-9


def test_eval_on_karpathy_json_with_five_captions(tmp_path, pretrain_args, minilm_dir):
    pytest.importorskip("lait.testkit.scenes")
    from kit.synthetic_shards import scene_samples, write_shards

    samples = scene_samples(6, seed=3, width=96, height=80)
    write_shards(tmp_path / "shards", samples * 2, per_shard=6)
    pre = tmp_path / "pre"
    regions = ["--set", "data.regions.source=patches", "--set", "data.regions.patch_grid=[2, 4]",
               "--set", "data.regions.patch_pixels=2", "--set", "data.regions.image_size=32"]
    model = tmp_path / "m.yaml"
    model.write_text("hidden_size: 32\nnum_layers: 1\nnum_heads: 2\nintermediate_size: 64\nmax_text_len: 64\n"
                     "region_feature_dim: 12\nnum_object_classes: 2\nembed_dim: 16\n")
    assert main(pretrain_args(pre, tmp_path / "shards", minilm_dir, steps=2,
                              extra=[*regions, "--set", f"model={model}", "--set", "stages.0.tasks.moc=0"])) == 0
    images = tmp_path / "images"
    images.mkdir()
    items = []
    for i, s in enumerate(samples):
        (images / f"{i}.jpg").write_bytes(s.jpg)
        items.append({"filename": f"{i}.jpg", "split": "test", "sentences": [{"raw": f"{s.caption} {j}"} for j in range(5)]})
    items.append({"filename": "x.jpg", "split": "train", "sentences": [{"raw": "not loaded"}]})
    (tmp_path / "karpathy.json").write_text(json.dumps({"images": items}))
    out = tmp_path / "k.json"
    assert main(["eval", "--checkpoint", str(pre / "checkpoints" / "stage-0-s0.pt"), "--karpathy-json",
                 str(tmp_path / "karpathy.json"), "--image-root", str(images), "--device", "cpu", "--output", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["images"] == 6 and r["texts"] == 30 and r["itm_pairs_scored"] == 180
