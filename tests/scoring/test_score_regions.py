"""Acceptance 4: `--regions` writes at most `max_regions` fp16 region features per image with
boxes in [0, 1] and codebook labels; scoring the same input again gives identical output.
Also the near-duplicate pairs found over the image embeddings."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from kit.scoring_data import jpeg, tiny_config_file, write_work  # noqa: E402
from lait.arrays import cell_grid, load_regions, stack_embs  # noqa: E402
from lait.scoring.config import ScoreConfig  # noqa: E402
from lait.scoring.neardup import find_near_dups  # noqa: E402
from lait.scoring.pipeline import score_work  # noqa: E402
from lait.scoring.regions import load_codebook, pool_tokens  # noqa: E402


def build(root: Path, tmp: Path):
    images = {f"http://site/img/{i}.jpg": jpeg(i) for i in range(12)}
    # A resized re-encode of image 0 under another URL: a near-duplicate.
    img = Image.open(io.BytesIO(images["http://site/img/0.jpg"])).resize((110, 88))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=80)
    images["http://cdn/copy-of-0.jpg"] = buf.getvalue()
    cands = [("http://site/p", u, [("a picture", "alt"), (f"caption {i}", "figcaption")]) for i, u in enumerate(images)]
    work = write_work(root, images, cands)
    # max_regions 3 < the 4x4 patch grid: exercises pooling the grid down.
    cfg = ScoreConfig(work=str(work.root), model_config=str(tiny_config_file(tmp)), allow_random_init=True,
                      regions=True, max_regions=3, codebook_k=4, batch_size=5, progress=False,
                      near_dup_threshold=0.99)
    return work, cfg


def snapshot(work):
    out = {}
    for table in ("scored", "image_embs", "text_embs", "regions", "region_labels", "near_dups"):
        out[table] = work.read(table).to_pylist()
    out["codebook"] = load_codebook(work).tobytes()
    return out


def test_regions_boxes_labels_and_identical_rerun(tmp_path):
    work, cfg = build(tmp_path / "a", tmp_path)
    assert score_work(cfg).ok
    regions = {}
    for p in work.partitions("regions"):
        regions.update(load_regions(work, p))
    assert len(regions) == 13
    codebook = load_codebook(work)
    assert codebook.shape == (4, 64)
    for r in regions.values():
        n = r.features.shape[0]
        assert 1 <= n <= 3 and r.features.dtype == np.float16 and r.features.shape[1] == 64
        assert r.boxes.shape == (n, 4) and r.boxes.min() >= 0 and r.boxes.max() <= 1
        assert (r.boxes[:, 2] > r.boxes[:, 0]).all() and (r.boxes[:, 3] > r.boxes[:, 1]).all()
        assert r.labels is not None and r.labels.shape == (n,)
        assert ((r.labels >= 0) & (r.labels < 4)).all()
        # A label is the nearest centroid of its feature.
        d = ((r.features.astype(np.float32)[:, None] - codebook[None]) ** 2).sum(-1)
        np.testing.assert_array_equal(r.labels, d.argmin(1))
    assert len({int(l) for r in regions.values() for l in r.labels}) > 1

    # The same input in a fresh directory gives byte-identical tables and codebook.
    again, cfg2 = build(tmp_path / "b", tmp_path)
    assert score_work(cfg2).ok
    assert snapshot(again) == snapshot(work)

    # A random-init model finds some unrelated flat images alike too; the copy must be among them.
    dups = work.read("near_dups").to_pylist()
    assert ("http://cdn/copy-of-0.jpg", "http://site/img/0.jpg") in [(d["image_url_a"], d["image_url_b"]) for d in dups]
    embs = {}
    for p in work.partitions("image_embs"):
        t = work.read("image_embs", p)
        embs.update(zip(t.column("image_url").to_pylist(), stack_embs(t).astype(np.float32)))
    for d in dups:
        assert d["image_url_a"] < d["image_url_b"] and d["cosine"] >= 0.99
        assert abs(float(embs[d["image_url_a"]] @ embs[d["image_url_b"]]) - d["cosine"]) < 5e-3
    assert len(dups) < 13 * 12 / 2 / 2  # not "everything is a duplicate"


def test_find_near_dups_pairs_and_threshold():
    rng = np.random.default_rng(0)
    base = rng.standard_normal((6, 16)).astype(np.float32)
    x = np.concatenate([base, base[:2] + 0.01 * rng.standard_normal((2, 16)).astype(np.float32)])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    urls = [f"u{i}" for i in range(8)]
    pairs = find_near_dups(urls, x, threshold=0.98, k=3)
    assert [(a, b) for a, b, _ in pairs] == [("u0", "u6"), ("u1", "u7")]
    assert all(0.98 <= c <= 1.0 for _, _, c in pairs)
    assert find_near_dups(urls, x, threshold=1.01, k=3) == []


def test_pool_tokens_fits_the_budget():
    assert cell_grid(7, 7, 100) == (7, 7)
    rows, cols = cell_grid(14, 14, 100)
    assert rows * cols <= 100 and rows == cols == 10
    rows, cols = cell_grid(24, 16, 100)
    assert rows * cols <= 100 and rows > cols
    tokens = np.arange(2 * 16 * 3, dtype=np.float32).reshape(2, 16, 3)
    feats, boxes = pool_tokens(tokens, (4, 4), 4)
    assert feats.shape == (2, 4, 3) and feats.dtype == np.float16 and boxes.shape == (4, 4)
    # The top-left cell averages patches 0, 1, 4, 5.
    np.testing.assert_allclose(feats[0, 0], tokens[0, [0, 1, 4, 5]].mean(0), rtol=1e-3)
    np.testing.assert_allclose(boxes[0], [0, 0, 0.5, 0.5])
    np.testing.assert_allclose(boxes[-1], [0.5, 0.5, 1, 1])
