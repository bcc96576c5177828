"""The learned caption judge of stage 3 (`lait.filters.caption_judge`, `clean/not_caption`)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from lait.executor import LocalExecutor
from lait.filters.caption_judge import (
    ENCODER,
    FEATURES,
    WEIGHTS,
    CaptionJudge,
    JudgeInput,
    choose_threshold,
    fit,
    simple_features,
)
from lait.filters.config import CleanConfig
from lait.filters.text_stage import CleanStage

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
    assert judge.encoder_name == ENCODER == "minilm-static"
    assert judge.w.shape == (judge.encoder.dim + len(FEATURES),)
    assert 0.0 < judge.threshold < 1.0  # chosen in training (bench/captions/train_judge.py)
    p = judge.p_junk([x("A man riding a brown horse along a sandy beach"),
                      x("Two children playing football in a park", source="figcaption"),
                      x("Share on Facebook"), x("Company logo"), x("Subscribe to our newsletter")])
    assert p.shape == (5,) and ((0 <= p) & (p <= 1)).all()
    # Every caption reads as less likely junk than every interface text, by a margin.
    assert max(p[:2]) < 0.05 and min(p[2:]) > max(p[:2]) + 0.15, p
    assert p[:2].max() < judge.threshold <= p[3], p  # the logo is dropped, the captions kept


def test_missing_or_mismatched_weights_are_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="caption judge weights missing"):
        CaptionJudge.load(tmp_path / "none.npz")
    bad = tmp_path / "bad.npz"
    np.savez(bad, w=np.zeros(3), b=0.0, mean=np.zeros(3), std=np.ones(3), features=np.asarray(["a"]),
             encoder=np.asarray("all-minilm-l6-v2"))
    with pytest.raises(ValueError, match="trained on features"):
        CaptionJudge.load(bad)
    old = tmp_path / "old.npz"  # a judge of stage 3 version 5 had no threshold of its own
    np.savez(old, w=np.zeros(3), b=0.0, mean=np.zeros(3), std=np.ones(3), features=np.asarray(FEATURES),
             encoder=np.asarray("all-minilm-l6-v2"))
    with pytest.raises(ValueError, match="no threshold"):
        CaptionJudge.load(old)


def test_choose_threshold_keeps_the_most_rows_within_the_junk_target():
    # Ten rows read by the judge, sorted by probability; junk at 0.9, 0.8 and 0.35.
    p = np.array([0.05, 0.1, 0.15, 0.2, 0.3, 0.35, 0.5, 0.6, 0.8, 0.9])
    junk = np.array([0, 0, 0, 0, 0, 1, 0, 0, 1, 1], bool)
    asked = np.ones(10, bool)
    grid = np.array([0.1, 0.2, 0.4, 0.7, 0.85, 0.95])
    # Kept below 0.2: 3 rows, no junk; 0.4: 6 rows, 1 junk (16.7 %); 0.7: 8 rows, 1 junk (12.5 %);
    # 0.85: 9 rows, 2 junk (22 %). The highest threshold within the target wins.
    assert choose_threshold(p, junk, asked, target=0.125, grid=grid) == 0.7
    assert choose_threshold(p, junk, asked, target=0.12, grid=grid) == 0.2
    assert choose_threshold(p, junk, asked, target=0.30, grid=grid) == 0.95  # 3/10 junk kept at most
    # A junk row the judge does not read is kept at any threshold: no threshold reaches 0 %.
    unread = asked.copy()
    unread[0] = False
    junk0 = junk.copy()
    junk0[0] = True
    assert choose_threshold(p, junk0, unread, target=0.0, grid=grid) == 0.1  # the lowest: none meets it


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
    # A judge that reads every text as junk (bias only): each alt, title, og or context text the
    # rules kept is dropped as clean/not_caption, the probability in the detail; the figcaption
    # is not judged. The threshold is the weights' own (0.6 here), unless the settings give one.
    always = tmp_path / "always.npz"
    n = 128 + len(FEATURES)
    CaptionJudge(np.zeros(n), 5.0, np.zeros(n), np.ones(n), "minilm-static", threshold=0.6).save(always)
    texts, rejected = _run(make_work, td, caption_judge=str(always))
    assert texts == {"Fishing boats moored in a small harbour at sunrise."}  # the figcaption alone
    judged = [r for r in rejected if r["reason"] == "clean/not_caption"]
    assert {r["text"] for r in judged} >= {"Fishing boats moored in a small harbour at sunrise",  # the alt
                                           "We walked along the old harbour wall in the morning and watched "
                                           "the boats come in."}  # a context sentence of 15 words
    assert all(re.search(r"p\(junk\) 0\.99\d >= 0\.6$", r["detail"]) for r in judged), judged[0]["detail"]

    never = tmp_path / "never.npz"  # reads every text as junk with p 0.27: under 0.6, over 0.2
    CaptionJudge(np.zeros(n), -1.0, np.zeros(n), np.ones(n), "minilm-static", threshold=0.6).save(never)
    kept, _ = _run(make_work, td, caption_judge=str(never))
    assert "Fishing boats moored in a small harbour at sunrise" in kept
    strict, strict_rejected = _run(make_work, td, caption_judge=str(never), caption_judge_threshold=0.2)
    assert strict == {"Fishing boats moored in a small harbour at sunrise."}
    assert any(r["detail"].endswith("p(junk) 0.269 >= 0.2") for r in strict_rejected)

    off_texts, off_rejected = _run(make_work, td, caption_judge="none")
    assert "Fishing boats moored in a small harbour at sunrise" in off_texts
    assert not [r for r in off_rejected if r["reason"] == "clean/not_caption"]


def test_stage3_with_the_shipped_judge_keeps_the_caption_and_drops_the_logo(make_work, td):
    assert WEIGHTS.is_file()
    texts, rejected = _run(make_work, td)
    assert "Fishing boats moored in a small harbour at sunrise" in texts
    reasons = {r["text"]: r["reason"] for r in rejected if r["text"]}
    assert "Harbour Times company logo" not in texts
    # The logo's markup names it (clean/image_place) before its words do (boilerplate, the judge).
    assert reasons["Harbour Times company logo"] in ("clean/image_place", "clean/boilerplate", "clean/not_caption")


def test_threshold_must_be_a_probability():
    from lait.config import ConfigError

    with pytest.raises(ConfigError, match="caption_judge_threshold"):
        CleanConfig(work="w", caption_judge_threshold=0.0).validate()


def test_the_judge_leaves_an_alt_that_is_also_the_images_figcaption(make_work, td, tmp_path):
    # The same text as alt and figcaption is one candidate (source alt): the judge, which never
    # reads figcaptions, must not drop it through its alt copy (a planted caption was lost so).
    always = tmp_path / "always.npz"
    n = 128 + len(FEATURES)
    CaptionJudge(np.zeros(n), 5.0, np.zeros(n), np.ones(n), "minilm-static", threshold=0.5).save(always)
    caption = "Fishing boats moored in a small harbour at sunrise."
    page = PAGE.replace('alt="Fishing boats moored in a small harbour at sunrise"', f'alt="{caption}"')
    work = make_work()
    td.write_table(work, "pages", [td.page_row("http://site.test/harbour.html", page)], "url")
    cfg = CleanConfig(work=str(work.root), progress=False, caption_judge=str(always))
    assert LocalExecutor(workers=1, show_progress=False).run(CleanStage(cfg), work).ok
    texts = {t["text"] for r in work.iter_rows("candidates") for t in r["texts"]}
    assert texts == {caption}
    dropped = {r["text"] for r in work.iter_rows("rejected") if r["reason"] == "clean/not_caption"}
    assert caption not in dropped and "Later the fishermen sold their catch on the quay, as they have done for two hundred years." in dropped
