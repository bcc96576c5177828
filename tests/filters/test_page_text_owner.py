"""One owner for a text a page gives several pictures, also when the copies differ only in the
marks they end with (issue 33, after issue 22): `lait.filters.page_texts.assign`."""

from __future__ import annotations

from lait.filters.page_texts import ImageTexts, assign


def test_a_text_and_its_copy_with_a_full_stop_have_one_owner():
    images = [ImageTexts(["http://x.test/a.jpg"], 1, [("alt", "A heron in the lake", 0)]),
              ImageTexts(["http://x.test/b.jpg"], 5, [("figcaption", "A heron in the lake.", 0)])]
    per_url, dropped = assign(images)
    kept = {url: texts for url, texts in per_url}
    assert kept == {"http://x.test/a.jpg": [], "http://x.test/b.jpg": [("figcaption", "A heron in the lake.")]}
    assert [(d.image_url, d.text) for d in dropped] == [("http://x.test/a.jpg", "A heron in the lake")]


def test_texts_that_differ_in_words_stay_apart():
    images = [ImageTexts(["http://x.test/a.jpg"], 1, [("alt", "A heron in the lake", 0)]),
              ImageTexts(["http://x.test/b.jpg"], 5, [("alt", "A heron in the lake at dawn", 0)])]
    per_url, dropped = assign(images)
    assert dropped == [] and all(texts for _, texts in per_url)
