"""The learned caption judge of stage 3 (`lait.filters.caption_judge`, `clean/not_caption`)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from lait.executor import LocalExecutor
from lait.filters.caption_judge import (
    FEATURES,
    JUDGED_MAX_WORDS,
    WEIGHTS,
    CaptionJudge,
    JudgeInput,
    fit,
    simple_features,
)
from lait.filters.text_stage import CleanConfig, CleanStage

PAGE = """<!DOCTYPE html><html lang="en"><head><title>Harbour day</title></head><body><main>
<h1>A day at the harbour</h1>
<p>We walked along the old harbour wall in the morning and watched the boats come in.</p>
<figure><img src="/boats.jpg" alt="Fishing boats moored in a small harbour at sunrise">
<figcaption>Fishing boats moored in a small harbour at sunrise.</figcaption></figure>
<p>Later the fishermen sold their catch on the quay, as they have done for two hundred years.</p>
<img src="/logo.png" alt="Harbour Times company logo">
</main></body></html>"""


def x(text: str, source: str = "alt", **kw) -> JudgeInput:
    return JudgeInput(text, source, kw.get("position", 0.5), kw.get("site_count", 1), kw.get("site_pages", 10),
                      kw.get("lang", "en"), kw.get("page_lang", "en"))


def test_shipped_judge_loads_and_reads_junk_as_junk():
    judge = CaptionJudge.load()
    assert judge.w.shape == (384 + len(FEATURES),)
    p = judge.p_junk([x("A man riding a brown horse along a sandy beach"),
                      x("Two children playing football in a park", source="figcaption"),
                      x("Share on Facebook"), x("Company logo"), x("Subscribe to our newsletter")])
    assert p.shape == (5,) and ((0 <= p) & (p <= 1)).all()
    # Every caption reads as less likely junk than every interface text, by a margin.
    assert max(p[:2]) < 0.1 and min(p[2:]) > 0.3, p


def test_missing_or_mismatched_weights_are_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="caption judge weights missing"):
        CaptionJudge.load(tmp_path / "none.npz")
    bad = tmp_path / "bad.npz"
    np.savez(bad, w=np.zeros(3), b=0.0, mean=np.zeros(3), std=np.ones(3), features=np.asarray(["a"]),
             encoder=np.asarray("all-minilm-l6-v2"))
    with pytest.raises(ValueError, match="trained on features"):
        CaptionJudge.load(bad)


def test_fit_learns_a_separable_rule():
    rs = np.random.default_rng(0)
    xs = rs.normal(size=(200, 5))
    y = (xs[:, 2] > 0.3).astype(float)
    judge = fit(xs, y, l2=0.1, steps=500)
    acc = ((judge.p_junk_of_matrix(xs) >= 0.5) == y).mean()
    assert acc > 0.95
    again = fit(xs, y, l2=0.1, steps=500)
    assert np.array_equal(judge.w, again.w)  # reproducible


def test_simple_features_read_source_length_site_and_language():
    f = dict(zip(FEATURES, simple_features(x("Zwei Boote im Hafen…", source="og", site_count=4, site_pages=8,
                                             lang="de", page_lang="de-DE"))))
    assert f["source_og"] == 1.0 and f["source_alt"] == 0.0
    assert f["site_share"] == 0.5 and f["lang_is_page_lang"] == 1.0 and f["lang_en"] == 0.0
    assert f["ends_cut"] == 1.0


def _run(make_work, td, **settings):
    work = make_work()
    td.write_table(work, "pages", [td.page_row("http://site.test/harbour.html", PAGE)], "url")
    cfg = CleanConfig(work=str(work.root), progress=False, **settings)
    assert LocalExecutor(workers=1, show_progress=False).run(CleanStage(cfg), work).ok
    texts = {t["text"] for r in work.iter_rows("candidates") for t in r["texts"]}
    return texts, list(work.iter_rows("rejected"))


def test_stage3_drops_what_the_judge_rejects_with_its_probability(make_work, td, tmp_path):
    # A judge that reads every text as junk (bias only): each short alt, title, og or context
    # text the rules kept is dropped as clean/not_caption, the probability in the detail; the
    # figcaption and texts longer than JUDGED_MAX_WORDS are not judged.
    always = tmp_path / "always.npz"
    n = 384 + len(FEATURES)
    CaptionJudge(np.zeros(n), 5.0, np.zeros(n), np.ones(n), "all-minilm-l6-v2").save(always)
    texts, rejected = _run(make_work, td, caption_judge=str(always))
    assert "Fishing boats moored in a small harbour at sunrise." in texts  # the figcaption
    assert "Fishing boats moored in a small harbour at sunrise" not in texts  # the alt
    others = texts - {"Fishing boats moored in a small harbour at sunrise."}
    assert all(len(t.split()) > JUDGED_MAX_WORDS for t in others), others  # long ones are not judged
    judged = [r for r in rejected if r["reason"] == "clean/not_caption"]
    assert {r["text"] for r in judged} >= {"Fishing boats moored in a small harbour at sunrise"}  # the alt
    assert all(re.search(r"p\(junk\) 0\.99\d >= 0\.5", r["detail"]) for r in judged), judged[0]["detail"]

    off_texts, off_rejected = _run(make_work, td, caption_judge="none")
    assert "Fishing boats moored in a small harbour at sunrise" in off_texts
    assert not [r for r in off_rejected if r["reason"] == "clean/not_caption"]


def test_stage3_with_the_shipped_judge_keeps_the_caption_and_drops_the_logo(make_work, td):
    assert WEIGHTS.is_file()
    texts, rejected = _run(make_work, td)
    assert "Fishing boats moored in a small harbour at sunrise" in texts
    reasons = {r["text"]: r["reason"] for r in rejected if r["text"]}
    assert "Harbour Times company logo" not in texts
    assert reasons["Harbour Times company logo"] in ("clean/boilerplate", "clean/not_caption")


def test_threshold_must_be_a_probability():
    from lait.config import ConfigError

    with pytest.raises(ConfigError, match="caption_judge_threshold"):
        CleanConfig(work="w", caption_judge_threshold=0.0).validate()
