"""Stage 4 end to end on a small work directory with a tiny random-init open_clip model."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from kit.scoring_data import jpeg, tiny_config_file, write_work  # noqa: E402
from lait.app import score as command
from lait.arrays import stack_embs
from lait.scoring.config import ScoreConfig
from lait.scoring.pipeline import score_work

TEXTS = ["a red square", "click here", "IMG_2041.JPG", "a photo of a dog on a beach"]


def make_dir(tmp_path, broken: bool = False):
    images = {f"http://site/img/{i}.jpg": jpeg(i) for i in range(10)}
    if broken:
        images["http://site/img/broken.jpg"] = b"\xff\xd8\xff not really a jpeg"
    cands = []
    for i, url in enumerate(images):
        # Alt texts repeat across images and pages, as on the web.
        cands.append((f"http://site/page{i % 3}", url, [(TEXTS[i % 4], "alt"), (TEXTS[(i + 1) % 4], "context")]))
    cands.append(("http://site/page9", "http://site/img/0.jpg", [("a red square", "figcaption")]))
    cands.append(("http://site/page9", "http://site/img/gone.jpg", [("filtered out in stage 2", "alt")]))
    return write_work(tmp_path / "work", images, cands), images


def cfg_for(tmp_path, work, **kw):
    return ScoreConfig(work=str(work.root), model_config=str(tiny_config_file(tmp_path)), allow_random_init=True,
                       batch_size=4, loader_workers=kw.pop("loader_workers", 2), fast_decode=False, progress=False,
                       **kw)


def direct_scores(cfg_path, images: dict[str, bytes], pairs):
    """What open_clip computes for the same pairs with its own preprocess and tokenizer."""
    import io

    import open_clip
    from open_clip.transform import PreprocessCfg, image_transform_v2
    from PIL import Image

    from lait.scoring.model import get_scorer

    open_clip.add_model_config(cfg_path)
    # Same weights as the stage: the scorer is cached in this process.
    model = get_scorer(ScoreConfig(work="x", model_config=str(cfg_path), allow_random_init=True, batch_size=4,
                                   loader_workers=2, fast_decode=False, progress=False)).model
    preprocess = image_transform_v2(PreprocessCfg(**model.visual.preprocess_cfg), is_train=False)
    tokenizer = open_clip.get_tokenizer(cfg_path.stem)
    out = []
    with torch.no_grad():
        for url, text in pairs:
            x = preprocess(Image.open(io.BytesIO(images[url]))).unsqueeze(0)
            i = model.encode_image(x, normalize=True)
            t = model.encode_text(tokenizer([text]), normalize=True)
            out.append(float((i @ t.T).item()))
    return np.array(out)


def test_scores_equal_direct_open_clip(tmp_path):
    work, images = make_dir(tmp_path, broken=True)
    cfg = cfg_for(tmp_path, work)
    report = score_work(cfg)
    assert report.ok, report.summary()
    scored = work.read("scored").to_pylist()
    # 10 images x 2 texts + 1 extra page; the broken image and the filtered one are not scored.
    assert len(scored) == 21
    assert {r["model"] for r in scored} == {"lait-test-tiny"} and {r["pretrained"] for r in scored} == {"random-init"}
    expected = direct_scores(tmp_path / "lait-test-tiny.json", images, [(r["image_url"], r["text"]) for r in scored])
    got = np.array([r["score"] for r in scored])
    np.testing.assert_allclose(got, expected, atol=2e-5)
    assert np.ptp(got) > 0.01  # a constant score would pass the comparison too easily

    # The broken image is rejected per pair with its reason; nothing else is.
    rejected = work.read("rejected").to_pylist()
    assert {r["reason"] for r in rejected} == {"score/decode_error"}
    assert {r["image_url"] for r in rejected} == {"http://site/img/broken.jpg"}
    assert len(rejected) == 2

    # Refs point at the pair's fp16 embeddings in the same partition; texts are stored once.
    for p in work.partitions("scored"):
        img_t, txt_t = work.read("image_embs", p), work.read("text_embs", p)
        texts = txt_t.column("text").to_pylist()
        assert len(texts) == len(set(texts))
        imgs, txts = stack_embs(img_t).astype(np.float32), stack_embs(txt_t).astype(np.float32)
        np.testing.assert_allclose(np.linalg.norm(imgs, axis=1), 1, atol=2e-3)
        for r in work.read("scored", p).to_pylist():
            assert img_t.column("image_url")[r["image_emb_ref"]].as_py() == r["image_url"]
            assert texts[r["text_emb_ref"]] == r["text"]
            assert abs(float(imgs[r["image_emb_ref"]] @ txts[r["text_emb_ref"]]) - r["score"]) < 3e-3
    stats = work.done_stats("score")
    assert sum(s["counters"].get("score/no_image", 0) for s in stats) == 1
    # Text de-duplication: fewer encoded texts than pairs.
    assert sum(s["counters"]["score/distinct_texts"] for s in stats) < sum(s["counters"]["score/pairs"] for s in stats)


def test_inline_and_pooled_decoding_agree(tmp_path):
    a, _ = make_dir(tmp_path / "a")
    b, _ = make_dir(tmp_path / "b")
    assert score_work(cfg_for(tmp_path, a, loader_workers=0)).ok
    assert score_work(cfg_for(tmp_path, b, loader_workers=2, workers=2)).ok
    ra, rb = a.read("scored").to_pylist(), b.read("scored").to_pylist()
    assert [(r["image_url"], r["text"]) for r in ra] == [(r["image_url"], r["text"]) for r in rb]
    np.testing.assert_allclose([r["score"] for r in ra], [r["score"] for r in rb], atol=1e-5)


def test_rerun_skips_finished_partitions(tmp_path):
    work, _ = make_dir(tmp_path)
    cfg = cfg_for(tmp_path, work)
    first = score_work(cfg)
    before = work.read("scored").to_pylist()
    second = score_work(cfg)
    assert first.done and not second.done and sorted(second.skipped) == first.done
    assert work.read("scored").to_pylist() == before


def parse(argv):
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    command.register(sub)
    return p.parse_args(["score", *argv])




def test_missing_pretrained_weights_is_a_clear_error_and_writes_nothing(tmp_path, python):
    import subprocess

    work, _ = make_dir(tmp_path)
    before = sorted(p.relative_to(work.root) for p in work.root.rglob("*"))
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    # No network here, as on a machine without internet; offline mode makes the hub fail at once.
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([python, "-m", "lait", "score", str(work.root), "--model", "ViT-B-32",
                           "--pretrained", "laion2b_s34b_b79k", "--cache-dir", str(cache)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    msg = proc.stderr
    assert "laion2b_s34b_b79k" in msg and str(cache) in msg and "--checkpoint" in msg
    assert "Traceback" not in msg
    # Nothing but the lock file, empty once released: the command takes the work directory
    # before it loads a model, so a busy one is refused at once.
    after = sorted(p.relative_to(work.root) for p in work.root.rglob("*"))
    assert sorted(set(after) - {Path("_lock")}) == before and (work.root / "_lock").read_bytes() == b""
    assert not list(cache.rglob("*.safetensors")) and not list(cache.rglob("*.bin"))


def test_no_weights_without_allow_random_init_is_an_error(tmp_path):
    from lait.config import ConfigError

    work, _ = make_dir(tmp_path)
    args = parse([str(work.root), "--model-config", str(tiny_config_file(tmp_path)), "--no-progress"])
    with pytest.raises(ConfigError, match="allow_random_init"):
        args.func(args)
    assert not (work.root / "scored").exists()


def test_checkpoint_round_trip(tmp_path):
    """A local --checkpoint loads (weights_only) and gives the scores of the model it came from."""
    import open_clip
    from open_clip.transform import PreprocessCfg, image_transform_v2
    from safetensors.torch import save_file

    cfg_path = tiny_config_file(tmp_path, "lait-test-ckpt")
    open_clip.add_model_config(cfg_path)
    torch.manual_seed(123)
    model = open_clip.create_model("lait-test-ckpt")
    ckpt = tmp_path / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt))
    work, images = make_dir(tmp_path)
    args = parse([str(work.root), "--model-config", str(cfg_path), "--checkpoint", str(ckpt), "--no-progress",
                  "--no-fast-decode", "--loader-workers", "0"])
    assert args.func(args) == 0
    scored = work.read("scored").to_pylist()
    assert {r["pretrained"] for r in scored} == {"file:weights.safetensors"}
    tok = open_clip.get_tokenizer("lait-test-ckpt")
    pre = image_transform_v2(PreprocessCfg(**model.visual.preprocess_cfg), is_train=False)
    import io

    from PIL import Image

    r = scored[0]
    with torch.no_grad():
        i = model.encode_image(pre(Image.open(io.BytesIO(images[r["image_url"]]))).unsqueeze(0), normalize=True)
        t = model.encode_text(tok([r["text"]]), normalize=True)
    assert abs(float(i @ t.T) - r["score"]) < 2e-5


class _ReportNiceness:
    """A stand-in decoder that reports the niceness of the process it runs in."""

    def __call__(self, items):
        import os

        import numpy as np

        from lait.scoring.decode import DecodedBatch

        return DecodedBatch([f"{key}:{os.nice(0)}" for key, _ in items], np.zeros((len(items), 1, 1, 3), np.uint8))


def test_decode_workers_yield_the_cores_to_the_model():
    """Decoding runs ahead in worker processes at a lower priority than the model's threads."""
    import os

    from lait.scoring.decode import DECODER_NICE, decode_stream

    parent = os.nice(0)
    batches = list(decode_stream(_ReportNiceness(), [(f"u{i}", b"") for i in range(6)], batch_size=2, workers=2))
    keys = [k for b in batches for k in b.keys]
    assert [k.split(":")[0] for k in keys] == [f"u{i}" for i in range(6)]  # input order kept
    assert {int(k.split(":")[1]) for k in keys} == {min(19, parent + DECODER_NICE)}
    assert os.nice(0) == parent
