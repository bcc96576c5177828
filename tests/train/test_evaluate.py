"""Recall@K against a brute-force reference, and eval end to end on shards (full and shortlist)."""

from __future__ import annotations

import numpy as np
import pytest

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


def test_itm_accuracy_pairs_each_image_with_its_first_caption_and_another_images():
    import torch

    from lait.train.evaluate import RetrievalScorer

    owner = np.array([0, 0, 1, 2, 2, 2, 3])  # caption -> image; the first captions are 0, 2, 3, 6
    scorer = object.__new__(RetrievalScorer)
    scorer.feats = torch.zeros(4, 1, 1)
    seen = []

    def oracle(text_idx, image_idx):  # +1 for a caption of the image, -1 for another's
        seen.append((text_idx.tolist(), image_idx.tolist()))
        return torch.tensor([1.0 if owner[t] == i else -1.0 for t, i in zip(text_idx.tolist(), image_idx.tolist())])

    scorer.itm = oracle
    r = scorer.itm_accuracy(owner)
    assert (r["itm_acc"], r["itm_pos_acc"], r["itm_neg_acc"], r["itm_auc"]) == (1.0, 1.0, 1.0, 1.0)
    (pos_t, pos_i), (neg_t, neg_i) = seen
    assert pos_t == [0, 2, 3, 6] and pos_i == neg_i == [0, 1, 2, 3]
    assert set(neg_t) <= {0, 2, 3, 6} and all(owner[t] != i for t, i in zip(neg_t, neg_i))
    # A head that says "match" to everything is right on half the pairs.
    scorer.itm = lambda t, i: torch.ones(len(t))
    r = scorer.itm_accuracy(owner)
    assert (r["itm_acc"], r["itm_pos_acc"], r["itm_neg_acc"]) == (0.5, 1.0, 0.0)
    with pytest.raises(ValueError, match="two images"):
        scorer.feats = torch.zeros(5, 1, 1)  # image 4 has no caption
        scorer.itm_accuracy(owner)


def test_centred_margins_remove_a_candidates_own_bias():
    """An image that every caption 'matches' (a bias of +5 on all its pairs) wins every text-to-image
    shortlist it is in until its own mean margin is subtracted; image-to-text rankings, where that
    image's bias is shared by all its candidates, keep their order."""
    from lait.train.evaluate import centre_margins

    rng = np.random.default_rng(0)
    n_img, n_txt = 6, 12
    text_to_image = np.arange(n_txt) % n_img
    truth = np.where(text_to_image[None, :] == np.arange(n_img)[:, None], 1.0, -1.0) + rng.normal(0, 0.1, (n_img, n_txt))
    biased = truth + np.where(np.arange(n_img)[:, None] == 2, 5.0, 0.0)
    shortlist = rng.random((n_img, n_txt)) < 0.7
    shortlist[text_to_image, np.arange(n_txt)] = True
    i2t = np.where(shortlist, biased, -np.inf)
    t2i = np.where(shortlist, biased, -np.inf)
    before = recall_at_k(i2t, t2i, text_to_image)
    c_i2t, c_t2i = centre_margins(i2t, t2i)
    after = recall_at_k(c_i2t, c_t2i, text_to_image)
    assert before["t2i_r1"] < 0.7 and after["t2i_r1"] == 1.0
    assert after["i2t_r1"] == before["i2t_r1"] == 1.0
    assert np.isneginf(c_i2t[~shortlist]).all() and np.isneginf(c_t2i[~shortlist]).all()
    # Within each image's text ranking the image's bias cancels: only text means move the order.
    row = np.flatnonzero(shortlist[2])
    assert np.argsort(-c_t2i[2, row]).tolist() == np.argsort(-(biased[2, row] - biased[2, row].mean())).tolist()
