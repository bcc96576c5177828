"""Acceptance 3: on the built-in local web, the offline demo scorer ranks each kept image's true
caption above the junk candidates a page offers for it (alt junk, headlines, body sentences,
credits, the captions of the page's other pictures)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kit.scoring_data import write_work  # noqa: E402
from lait.scoring.config import ScoreConfig  # noqa: E402
from lait.scoring.pipeline import score_work  # noqa: E402

pytestmark = pytest.mark.slow  # builds the demo scorer on first use (cached afterwards)


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(score of a random positive > score of a random negative), ties counted half."""
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)


def site_candidates(n_pages: int, seed: int):
    """(images, candidates, truth) for every kept captioned image of a generated site."""
    from lxml import html as lh

    from lait.testkit.generator import generate_site

    site = generate_site(n_pages, seed=seed)
    gt = site.ground_truth()
    images, cands, truth = {}, [], {}
    for path, page in gt["pages"].items():
        if not path.startswith(("/articles/", "/de/", "/fr/")):
            continue
        doc = lh.fromstring(site.route(path).body)
        body = " ".join(p.text_content() for p in doc.iter("p"))
        sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", body) if len(s.strip()) > 3]
        page_caps = {r["true_caption"] for r in page["images"] if r.get("true_caption")}
        for ref in page["images"]:
            url, cap = ref["url"], ref.get("true_caption")
            if not cap or not gt["images"][url]["keep"] or url in truth:
                continue
            texts = [(cap, "alt")]
            texts += [(t, "alt") for t in [ref.get("alt")] if t and t != cap]
            texts += [(page["title"], "og")]
            # Body sentences that do not contain this image's own caption ("The photo above shows ...").
            texts += [(s, "context") for s in sentences if cap not in s]
            texts += [(c, "figcaption") for c in sorted(page_caps - {cap})]
            texts += [(t, "alt") for t in gt["junk_texts"][:8]]
            images[url] = site.route(url).body
            cands.append((path, url, texts))
            truth[url] = cap
    return images, cands, truth


def test_demo_scorer_separates_true_captions_from_junk(tmp_path, demo_scorer):
    images, cands, truth = site_candidates(n_pages=60, seed=7)
    assert len(truth) >= 40
    work = write_work(tmp_path / "work", images, cands)
    report = score_work(ScoreConfig(work=str(work.root), model="demo", demo_dir=str(demo_scorer.root),
                                        progress=False, batch_size=64))
    assert report.ok, report.summary()
    rows = work.read("scored").to_pylist()
    assert {r["model"] for r in rows} == {"demo"}
    by_image: dict[str, list[tuple[float, bool]]] = {}
    for r in rows:
        by_image.setdefault(r["image_url"], []).append((r["score"], r["text"] == truth[r["image_url"]]))
    top1 = np.mean([max(s)[1] for s in by_image.values()])
    pos = np.array([s for v in by_image.values() for s, t in v if t])
    neg = np.array([s for v in by_image.values() for s, t in v if not t])
    auc = roc_auc(pos, neg)
    print(f"demo scorer on the local web: {len(by_image)} images, {len(rows)} pairs, "
          f"true caption ranked first for {top1:.1%}, ROC-AUC {auc:.3f}")
    assert top1 >= 0.9
    assert auc >= 0.9
