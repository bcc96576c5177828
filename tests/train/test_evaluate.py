"""Recall@K against a brute-force reference, and eval end to end on shards (full and shortlist)."""

from __future__ import annotations

import numpy as np

from lait.train.evaluate import recall_at_k


def _brute_force(scores, text_to_image, ks=(1, 5, 10)):
    n_img, n_txt = scores.shape
    out = {}
    for k in ks:
        hits = 0
        for i in range(n_img):
            order = list(np.argsort(-scores[i], kind="stable"))
            gts = [t for t in range(n_txt) if text_to_image[t] == i]
            hits += min(order.index(t) for t in gts) < k
        out[f"i2t_r{k}"] = hits / n_img
    for k in ks:
        hits = 0
        for t in range(n_txt):
            order = list(np.argsort(-scores[:, t], kind="stable"))
            hits += order.index(text_to_image[t]) < k
        out[f"t2i_r{k}"] = hits / n_txt
    out["rsum"] = sum(out.values())
    return out


def test_recall_matches_brute_force_five_captions_per_image():
    rng = np.random.default_rng(0)
    n_img = 40
    text_to_image = np.repeat(np.arange(n_img), 5)
    scores = rng.normal(size=(n_img, len(text_to_image)))
    scores[text_to_image, np.arange(len(text_to_image))] += 1.5  # some signal, so recalls are not ~0
    got = recall_at_k(scores, scores, text_to_image)
    ref = _brute_force(scores, text_to_image)
    assert got.keys() == ref.keys()
    for k in ref:
        assert abs(got[k] - ref[k]) < 1e-12, k


def test_recall_one_caption_per_image_and_perfect_scores():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(30, 30))
    ref = _brute_force(scores, np.arange(30))
    assert recall_at_k(scores, scores, np.arange(30)) == ref
    perfect = recall_at_k(np.eye(30), np.eye(30), np.arange(30))
    assert perfect["i2t_r1"] == perfect["t2i_r1"] == 1.0 and perfect["rsum"] == 6.0
