"""Learning test: pretrain then finetune a small ImageBERT on rendered shapes scenes, and retrieve
100 held-out images by caption and captions by image (chance R@1 = 0.01).

Region features come from the pixels only (``regions.source: patches``: a grid of pooled cells).
The grid is 3x3 cells of 8x8 pooled pixels: the scenes put shapes at left/right/top/bottom/center,
so each shape falls inside one cell, at a resolution where its colour and outline are visible (a
4x4 grid of 6x6 cells split every shape across cell borders). Pretraining adds the in-batch
contrastive task (``tasks.itc``): without it the ITM cross-encoder stays at chance for the whole
run; with it ITM starts learning once the unimodal states are aligned. Asserted in the evaluator's
``shortlist`` mode (top 5 by embedding similarity, ITM re-ranking); ``full`` mode (every pair
through the ITM cross-encoder) is printed beside it.

The budget (issue 48): pretraining sees 16,000 samples in 250 steps of 64 (as many as the 500
steps of 32 before; 250 steps of 32 reached only 0.26 / 0.26: the larger batch gives ITC more
negatives), finetuning 1,600 in 100 steps of 16, each with 2 hard negatives per side (a quarter
of the 200 steps of 32 before). Shortlist R@1 measured with it: 0.45 / 0.43 (i2t / t2i); with
160 pretraining steps it fell to 0.23 / 0.24; finetuning 100 steps of 32 gave 0.51 / 0.50 for
twice the finetuning time. Those figures came with a vocabulary that changed from run to run
(see `learn`); with the fixed one, and the binary term of issue 49: 0.56 / 0.53.
"""

from __future__ import annotations

import json
import time

import pytest

from lait.app.train import main

SMALL_MODEL = """
vocab_size: {vocab_size}
hidden_size: 128
num_layers: 3
num_heads: 4
intermediate_size: 256
max_text_len: 64
region_feature_dim: 192
num_object_classes: 2
embed_dim: 64
dropout: 0.0
attention_dropout: 0.0
"""

REGIONS = ["--set", "data.regions.source=patches", "--set", "data.regions.patch_grid=[3, 3]",
           "--set", "data.regions.patch_pixels=8", "--set", "data.regions.max_regions=9",
           "--set", "data.regions.image_size=96", "--set", "data.max_text_len=32"]


def learn(tmp_path, n_train=2000, pre_steps=250, ft_steps=100, batch=64, ft_batch=16, workers=1, seed=0, ft_extra=()):
    from kit.synthetic_shards import scene_samples, write_shards

    t0 = time.perf_counter()
    train = scene_samples(n_train, seed=1, width=192, height=160)
    write_shards(tmp_path / "train", train, per_shard=n_train // 4)
    write_shards(tmp_path / "test", scene_samples(100, seed=2, width=192, height=160), per_shard=100)
    # A WordPiece vocabulary of the training captions' 49 words and their characters, instead of
    # BERT's 30,522, keeps the tiny model (and this test) fast. It is the same in every run: the
    # one `tokenizers` trained before changed from run to run, and the figures with it (ITM
    # accuracy 0.54 to 0.825, shortlist R@1 0.44 to 0.60 for the same settings).
    from kit.synthetic_shards import train_wordpiece
    from lait.train.data import WordPiece

    tokenizer = train_wordpiece([s.caption for s in train], tmp_path / "tokenizer", vocab_size=300)
    model = tmp_path / "imagebert-small.yaml"
    model.write_text(SMALL_MODEL.format(vocab_size=WordPiece(tokenizer).special.vocab_size))
    common = ["--device", "cpu", "--set", f"model={model}", "--set", f"data.tokenizer={tokenizer}",
              "--set", f"data.num_workers={workers}", "--set", "log_every=25", "--set", "tensorboard=false", "--set", "cpu_threads=1", "--set", f"seed={seed}", *REGIONS]
    stage = (f"[{{name: scenes, shards: '{tmp_path / 'train'}', steps: {pre_steps}, batch_size: {batch},"
             f" optim: {{lr: 1.0e-3, warmup_steps: 25, schedule: linear}}, tasks: {{moc: 0.0, itc: 1.0}}}}]")
    assert main(["pretrain", "--output-dir", str(tmp_path / "pre"), *common, "--set", f"stages={stage}"]) == 0
    t1 = time.perf_counter()
    ft_stage = (f"{{name: ft, shards: '{tmp_path / 'train'}', steps: {ft_steps}, batch_size: {ft_batch},"
                f" optim: {{lr: 1.0e-3, warmup_steps: 25, schedule: linear}}}}")
    assert main(["finetune", "--output-dir", str(tmp_path / "ft"), *common, "--set", f"stage={ft_stage}",
                 "--init-from", str(tmp_path / "pre" / "checkpoints" / "stage-0-scenes.pt"),
                 "--loss", "multiclass", "--set", "num_negatives=2", "--set", "binary_weight=1.0", *ft_extra]) == 0
    t2 = time.perf_counter()
    results = {}
    for mode in (["--mode", "shortlist", "--shortlist-k", "5"], ["--mode", "full"], ["--mode", "itm"]):
        out = tmp_path / "eval.json"
        assert main(["eval", "--checkpoint", str(tmp_path / "ft" / "checkpoints" / "stage-0-ft.pt"),
                     "--shards", str(tmp_path / "test"), *mode, "--device", "cpu", "--set", "cpu_threads=1",
                     "--output", str(out)]) == 0
        result = json.loads(out.read_text())
        results[result["mode"]] = result
    results["timing"] = {"pretrain_s": t1 - t0, "finetune_s": t2 - t1, "eval_s": time.perf_counter() - t2}
    return results


@pytest.mark.slow
@pytest.mark.xdist_group("train-heavy")  # never beside test_real_photos (tests/conftest.py)
def test_pretrain_finetune_retrieves_held_out_scenes(tmp_path):
    pytest.importorskip("lait.testkit.scenes")
    results = learn(tmp_path)
    print(json.dumps(results, indent=2))
    # Asserted in the evaluator's shortlist mode (top 5 of 100 by embedding similarity, then ITM
    # re-ranking), as the evaluator reports it: the ITM margin plus the contrastive logit (0.56 /
    # 0.53 measured; the embeddings alone 0.52 / 0.54, the ITM margin alone 0.39 / 0.44). Full
    # cross-encoder scoring of all 10,000 pairs is printed beside it (R@1 0.12 / 0.11, R@10 0.61 /
    # 0.73 measured with this budget).
    result = results["shortlist@5"]
    assert result["images"] == 100
    assert result["i2t_r1"] >= 0.3, results
    assert result["t2i_r1"] >= 0.3, results
    assert results["full"]["i2t_r10"] > 0.1 and results["full"]["t2i_r10"] > 0.1, results  # chance: 0.1
    # The cross-encoder as a classifier on held-out pairs (each scene with its caption and with
    # another scene's), at the sign of its margin (issue 49): 0.79 measured (0.765 and 0.705 with
    # seeds 1 and 2). Finetuning adds the balanced match / no-match term to the multiclass loss
    # (`binary_weight`): the multiclass loss alone trains the margin between a match and its
    # negatives, never its sign.
    assert results["itm"]["itm_acc"] > 0.6, results["itm"]
    assert results["itm"]["itm_auc"] > 0.6, results["itm"]


if __name__ == "__main__":  # tuning aid: python tests/train/test_learning.py /tmp/dir
    import sys
    from pathlib import Path

    print(json.dumps(learn(Path(sys.argv[1]), seed=int(sys.argv[2]), ft_extra=sys.argv[3:]), indent=2))
