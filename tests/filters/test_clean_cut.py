"""Stage 3 never keeps a text the site cut short (issue 33): it mends it from the page's own
text, or drops it as `clean/cut`."""

from __future__ import annotations

import pytest

from lait.executor import LocalExecutor
from lait.filters.config import CleanConfig
from lait.filters.text_rules import Candidate, text_filters, uncut
from lait.filters.text_stage import CleanStage

PARAGRAPH = ("The storm passed over the island during the night. Fishermen stayed in the harbour until "
             "noon, mending their nets.")


def page(og_description: str, alt: str = "A red fishing boat in the harbour") -> str:
    return (f'<html lang="en"><head><meta property="og:image" content="/og/cover.jpg">'
            f'<meta property="og:description" content="{og_description}"></head><body><article>'
            f'<h1>The coast</h1><p>{PARAGRAPH}</p><img src="/boat.jpg" alt="{alt}"></article></body></html>')


def clean(make_work, td, html: str):
    work = make_work()
    td.write_table(work, "pages", [td.page_row("http://news.test/a.html", html)], "url")
    cfg = CleanConfig(work=str(work.root), progress=False)
    cfg.validate()
    report = LocalExecutor(workers=1, retries=0, show_progress=False).run(CleanStage(cfg), work)
    assert report.ok, report.summary()
    kept = {(r["image_url"].rsplit("/", 1)[-1], t["source"], t["text"]) for r in work.iter_rows("candidates")
            for t in r["texts"]}
    return kept, list(work.iter_rows("rejected")), report


@pytest.mark.parametrize("og", [
    "The storm passed over the island during the night. Fishermen stayed in the harb…",
    "The storm passed over the island during the night. Fishermen stayed in the harbour until...",
    "The storm passed over the island during the night. Fishermen stayed in the harbour unt",  # mid-word
])
def test_a_cut_og_description_is_mended_from_the_page(make_work, td, og):
    kept, _, report = clean(make_work, td, page(og))
    og_texts = {text for image, source, text in kept if image == "cover.jpg" and source == "og"}
    assert og_texts == {"The storm passed over the island during the night.",
                        "Fishermen stayed in the harbour until noon, mending their nets."}
    assert not any(text.endswith(("…", "...")) for _, _, text in kept)
    assert sum(s["counters"].get("clean/cut_texts_mended", 0) for s in report.stats) == 1


def test_a_cut_text_the_page_does_not_hold_is_dropped(make_work, td):
    kept, rejected, _ = clean(make_work, td, page("A quiet evening in the village square…",
                                                  alt="Boats wait for the tide in the old..."))
    assert not any(text.endswith(("…", "...")) for _, _, text in kept)
    cut = {r["text"] for r in rejected if r["reason"] == "clean/cut"}
    assert cut == {"A quiet evening in the village square…", "Boats wait for the tide in the old..."}


def test_uncut_leaves_whole_texts_alone():
    page_text = lambda: PARAGRAPH  # noqa: E731
    assert uncut("The storm passed over the island during the night.", page_text) is None
    # A title without a full stop is not cut: the page goes on with a space, not a letter.
    assert uncut("The storm passed over the island", page_text, mid_word=True) is None
    # Cut mid-word is only asked of og texts, which sites cut to a length.
    assert uncut("The storm passed over the isl", page_text) is None
    assert uncut("The storm passed over the isl", page_text, mid_word=True) == (
        "The storm passed over the island during the night.")
    # An ellipsis the page itself has cannot be mended.
    assert uncut("He waited and waited...", lambda: "He waited and waited... Then it rained.") is None


def test_the_cut_rule_names_its_drop():
    rules = text_filters(min_words=2, max_words=80, min_letter_share=0.5, languages=["en"])
    for text in ("A man walks along the beach at…", "Boats in the harbour [...]", "Boats in the harbour . . ."):
        c = Candidate(text, "og", "u", "p")
        assert next(f.name for f in rules if f.keep(c) is not True) == "cut"
    whole = Candidate("A man walks along the beach at dawn.", "og", "u", "p")
    assert all(f.keep(whole) is True for f in rules)


def test_a_mended_og_text_and_the_pages_own_sentence_have_one_owner(make_work, td):
    # The og description is the lead paragraph cut short; the paragraph itself is the context of
    # the photo after it. Kept cut, the og text and the paragraph's sentence were two texts, and
    # the same sentence of the page reached two pictures (issue 33, issue 22's promise).
    html = ('<html lang="en"><head><meta property="og:image" content="/og/cover.jpg">'
            '<meta property="og:description" content="The storm passed over the island during the night. '
            'Fishermen stayed in the harb…"></head><body><article><h1>The coast</h1>'
            f'<p>{PARAGRAPH}</p><img src="/boat.jpg" alt="A red fishing boat in the harbour"></article></body></html>')
    kept, rejected, _ = clean(make_work, td, html)
    images_of: dict[str, set[str]] = {}
    for image, _, text in kept:
        images_of.setdefault(text, set()).add(image)
    assert {t: i for t, i in images_of.items() if len(i) > 1} == {}
    assert images_of["Fishermen stayed in the harbour until noon, mending their nets."] == {"cover.jpg"}
    assert any(r["reason"] == "clean/page_text" and r["text"] == "Fishermen stayed in the harbour until noon, "
               "mending their nets." for r in rejected)
