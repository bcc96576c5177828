"""Near-duplicate pairs: the vectorised pairing against a plain reading of its rule, on both k-NN backends."""

from __future__ import annotations

import numpy as np
import pytest

from lait.scoring.neardup import knn_inner_product, near_dup_pairs


def planted(n: int = 300, dim: int = 32, seed: int = 0, exact: bool = True):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    for i in range(0, n, 7):  # copies, some exact and some nudged, of every seventh image
        x[i + 1: i + 4] = x[i] + rng.normal(scale=0.02, size=(len(x[i + 1: i + 4]), dim)) * (i % 2 if exact else 1)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    urls = [f"http://h/{rng.integers(1 << 30):x}/{i}.jpg" for i in range(n)]
    return urls, x


def rule(urls, x, threshold, k):
    """The definition, one pair at a time: every pair within a row's k nearest others, url order,
    its highest cosine, sorted."""
    sims = x @ x.T
    pairs: dict[tuple[str, str], float] = {}
    for i in range(len(urls)):
        order = np.argsort(-sims[i], kind="stable")
        near = [j for j in order if j != i][:k]
        for j in near:
            if sims[i, j] >= threshold:
                a, b = sorted((urls[i], urls[j]))
                pairs[(a, b)] = max(pairs.get((a, b), -1.0), float(min(sims[i, j], 1.0)))
    return sorted((a, b, s) for (a, b), s in pairs.items())


@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_pairs_follow_the_rule(backend):
    urls, x = planted()
    a, b, s = near_dup_pairs(urls, x, 0.95, 4, backend)
    got = [(urls[i], urls[j], float(c)) for i, j, c in zip(a, b, s)]
    want = rule(urls, x, 0.95, 4)
    assert len(want) > 100
    assert [(p, q) for p, q, _ in got] == [(p, q) for p, q, _ in want]
    np.testing.assert_allclose([c for *_, c in got], [c for *_, c in want], atol=1e-5)


def test_backends_find_the_same_neighbours():
    _, x = planted(seed=1, exact=False)  # no exact copies: no ties to order either way
    (sf, jf), (st, jt) = knn_inner_product(x, 5, "faiss"), knn_inner_product(x, 5, "torch")
    np.testing.assert_allclose(sf, st, atol=1e-5)
    assert (jf == jt).all()
