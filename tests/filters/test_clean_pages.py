"""Stage 3 (`lait clean`): URL resolution, text sources, rules, and pages that try to break it."""

from __future__ import annotations

import argparse

import pytest
from lxml import etree
from lxml import html as lxml_html

from lait.app import stages as command
from lait.executor import LocalExecutor
from lait.filters.config import CleanConfig
from lait.filters.text_rules import Candidate, TextRules, split_sentences, text_filters
from lait.filters.text_stage import CleanStage
from lait.pagereader import image_urls, largest_candidate
from lait.workdir import partition_of

PAGE = "http://news.test/a/story.html"
ARTICLE = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Story</title>
<meta property="og:image" content="/og/cover.jpg">
<meta property="og:description" content="A lighthouse on a rocky coast at sunset.">
</head><body><header><img src="/logo.png" alt="logo"></header><article><h1>The coast</h1>
<p>The storm passed over the island during the night. Fishermen stayed in the harbour until noon.</p>
<figure><img src="pics/boat.jpg" srcset="pics/boat-320.jpg 320w, pics/boat-1280.jpg 1280w"
 alt="A red fishing boat in the harbour" title="The old harbour"><figcaption>Boats wait for the
 tide. <span class="credit">Photo: J. Doe</span></figcaption></figure>
<p>By the afternoon the wind had dropped. The boats went out again before dusk.</p>
<img data-src="//cdn.news.test/lazy/cliff.jpg" src="data:image/gif;base64,R0lGOD" alt="IMG_2041.JPG"
 aria-label="Cliffs above the bay in the evening light">
<p>Walkers returned to the cliff path by the evening, and the cafes reopened.</p>
</article></body></html>"""


def run_clean(work, **settings):
    cfg = CleanConfig(work=str(work.root), progress=False, **settings)
    cfg.validate()
    report = LocalExecutor(workers=1, retries=0, show_progress=False).run(CleanStage(cfg), work)
    assert report.ok, report.summary()


def test_image_urls_resolve_like_a_crawler():
    tree = lxml_html.document_fromstring(
        '<html><head><base href="http://other.test/dir/"></head><body>'
        '<img src="a.jpg#frag"><img src="b small.jpg" srcset="b2.jpg 2x, b3.jpg 3x">'
        '<picture><source srcset="p-800.webp 800w, p-1600.webp 1600w"><source srcset="p.jpg">'
        '<img src="p-fallback.jpg"></picture><img data-src="/lazy.jpg" src="data:,x">'
        '<meta property="og:image" content="https://og.test/x.jpg"></body></html>')
    assert image_urls(tree, PAGE) == [
        "http://other.test/dir/a.jpg", "http://other.test/dir/b%20small.jpg", "http://other.test/dir/b3.jpg",
        "http://other.test/dir/p-fallback.jpg", "http://other.test/dir/p-1600.webp", "http://other.test/dir/p.jpg",
        "http://other.test/lazy.jpg", "https://og.test/x.jpg"]
    assert largest_candidate("a.jpg 300w, b.jpg 1200w, c.jpg 600w") == "b.jpg"


def test_sources_context_and_repartitioning(make_work, td):
    work = make_work(n_partitions=4)
    td.write_table(work, "pages", [td.page_row(PAGE, ARTICLE)], "url")
    run_clean(work)
    got = {}
    for p in range(4):
        for r in work.iter_rows("candidates", p):
            assert partition_of(r["image_url"], 4) == p  # re-partitioned by image URL
            got[r["image_url"]] = {(t["source"], t["text"]) for t in r["texts"]}
            assert all(t["lang"] == "en" for t in r["texts"])
    boat = got["http://news.test/a/pics/boat-1280.jpg"]
    assert boat == got["http://news.test/a/pics/boat.jpg"]
    assert {("alt", "A red fishing boat in the harbour"), ("title", "The old harbour"),
            ("figcaption", "Boats wait for the tide."),
            ("context", "Fishermen stayed in the harbour until noon."),
            ("context", "By the afternoon the wind had dropped.")} <= boat
    cliff = got["http://cdn.news.test/lazy/cliff.jpg"]
    assert ("aria", "Cliffs above the bay in the evening light") in cliff
    assert not any(t == "IMG_2041.JPG" for _, t in cliff)
    assert ("og", "A lighthouse on a rocky coast at sunset.") in got["http://news.test/og/cover.jpg"]
    rejected = {(r["reason"], r["text"]) for r in work.iter_rows("rejected")}
    # The header's logo is the site's chrome by its file name: its alt and the headline beside it
    # are no caption of it (clean/image_place, issue 62).
    assert ("clean/filename", "IMG_2041.JPG") in rejected and ("clean/image_place", "logo") in rejected


@pytest.mark.parametrize("text, rule", [
    ("IMG_2041.JPG", "filename"), ("DSC01234", "filename"), ("see https://x.test/a", "url"),
    ("click here", "boilerplate"), ("Image 3", "boilerplate"), ("untitled", "boilerplate"),
    ("Sunset", "word_count"), ("12 345 678 / 90 12", "letters"), ("wow wow wow so nice", "repetition"),
    ("Sooooooo beautiful sunset", "repetition"), ("Ein roter Kreis auf blauem Hintergrund", "language"),
])
def test_each_rule_names_its_drop(text, rule):
    rules = text_filters(min_words=2, max_words=80, min_letter_share=0.5, languages=["en"])
    c = Candidate(text, "alt", "u", "p")
    failed = next((f.name for f in rules if f.keep(c) is not True), None)
    assert failed == rule
    ok = Candidate("A red fishing boat in the harbour", "alt", "u", "p")
    assert all(f.keep(ok) is True for f in rules) and ok.lang == "en"


def test_text_rules_judge_like_the_rules_in_order_and_each_text_once():
    rules = text_filters(min_words=2, max_words=80, min_letter_share=0.5, languages=["en"])
    calls = []

    class Counting(type(rules[0])):  # the first rule, counting the texts it is asked about
        def keep(self, c):
            calls.append(c.text)
            return super().keep(c)

    chain = TextRules([Counting(), *rules[1:]])
    for text in ("IMG_2041.JPG", "Sunset", "Ein roter Kreis auf blauem Hintergrund",
                 "A red fishing boat in the harbour"):
        c = Candidate(text, "alt", "u", "p")
        drops = [(f.name, kept[1]) for f in rules if (kept := f.keep(c)) is not True]
        verdict = chain.judge(text)
        assert (verdict.rule, verdict.detail) == (drops[0] if drops else (None, None))
        assert chain.judge(text) is verdict
    assert chain.judge("A red fishing boat in the harbour").lang == "en"
    assert chain.judge("Ein roter Kreis auf blauem Hintergrund").lang == "de"
    assert chain.judge("Sunset").lang is None  # dropped before the language rule
    assert len(calls) == 4  # a repeated text is not judged again


def test_sentence_splitting_respects_abbreviations():
    assert split_sentences("Dr. Smith met Mr. J. Doe in the U.S. yesterday. It rained! Did it? Yes.") == [
        "Dr. Smith met Mr. J. Doe in the U.S. yesterday.", "It rained!", "Did it?", "Yes."]


def test_site_wide_texts_are_dropped(make_work, td):
    work = make_work()
    rows = [td.page_row(f"http://blog.test/p{i}.html",
                        f'<html><body><img src="/banner.jpg" alt="Welcome to our lovely blog">'
                        f'<img src="/p{i}.jpg" alt="A brown dog number {i} on the beach"></body></html>')
            for i in range(8)]
    td.write_table(work, "pages", rows, "url")
    run_clean(work)
    kept = {r["image_url"]: r["texts"] for r in work.iter_rows("candidates")}
    assert "http://blog.test/banner.jpg" not in kept and len(kept) == 8
    reasons = [r["reason"] for r in work.iter_rows("rejected") if r["text"] == "Welcome to our lovely blog"]
    assert reasons == ["clean/site_boilerplate"] * 8


def test_bad_pages_are_rejected_or_handled(make_work, td):
    work = make_work()
    good = td.page_row("http://x.test/good.html", ARTICLE)
    deep = "<div>" * 10_000 + '<p>Deep inside.</p><img src="/deep.jpg" alt="A deep sea diver with a lamp">' + "</div>" * 10_000
    huge = ("<html><body>" + "<p>filler text here</p>" * 2_700_000
            + '<img src="/late.jpg" alt="Never reached in a cut page"></body></html>')
    latin1 = ('<html><head><meta charset="iso-8859-1"></head><body><img src="/cafe.jpg" '
              'alt="A busy café terrace on a sunny morning"></body></html>').encode("latin-1")
    broken = b'<html><body><img src="/broken.jpg" alt="A \xff\xfe broken \x80 encoded caption here"></body></html>'
    rows = [
        good,
        td.page_row("http://x.test/binary.html", bytes(range(256)) * 100),
        td.page_row("http://x.test/pdf", b"%PDF-1.4 ...", content_type="application/pdf"),
        td.page_row("http://x.test/latin1.html", latin1, content_type="text/html"),
        td.page_row("http://x.test/broken.html", broken, content_type="text/html; charset=utf-8"),
        td.page_row("http://x.test/huge.html", huge),
        td.page_row("http://x.test/deep.html", deep),
        td.page_row("http://x.test/404.html", "<html>gone</html>", status=404),
        td.page_row("http://x.test/bogus-charset.html", b'<img src="/b.jpg" alt="A tall tree in a park">',
                    content_type="text/html; charset=no-such-charset"),
    ]
    td.write_table(work, "pages", rows, "url")
    run_clean(work, max_page_bytes=10_000_000)
    pages_rejected = {r["page_url"]: r["reason"] for r in work.iter_rows("rejected") if r["image_url"] is None}
    assert pages_rejected == {"http://x.test/binary.html": "clean/not_html", "http://x.test/pdf": "clean/not_html",
                              "http://x.test/404.html": "clean/status", "http://x.test/deep.html": "clean/too_deep"}
    texts = {r["image_url"]: [t["text"] for t in r["texts"]] for r in work.iter_rows("candidates")}
    assert texts["http://x.test/cafe.jpg"] == ["A busy café terrace on a sunny morning"]
    assert "http://x.test/broken.jpg" in texts  # replacement characters, then repaired
    assert texts["http://x.test/b.jpg"] == ["A tall tree in a park"]
    assert "http://x.test/pics/boat-1280.jpg" in texts  # the good page lost nothing
    assert "http://x.test/late.jpg" not in texts  # the 50 MB page was cut at max_page_bytes
    stats = work.done_stats("clean_pages")[0]["counters"]  # the extraction pass reads the pages
    assert stats["clean/truncated_pages"] == 1


@pytest.mark.parametrize("text", [
    ARTICLE, "<p>caf\u00e9 \u2014 \u6771\u4eac \U0001f600 \ufffe \x0c\x00</p>", "\ufeff<p>a</p>",
    "<meta charset='iso-8859-1'><p>\u00e9 \u00fc</p>",
    "<?xml version='1.0' encoding='latin-1'?><p>x</p>",  # a str lxml refuses: unparsable, as before
    "<p>a lone \ud800 surrogate</p>", "", " ", "<!-- only a comment -->",
])
def test_a_decoded_page_parses_from_its_utf8_bytes_to_the_tree_of_its_text(text):
    from lait.filters.html_pages import _markup

    def parse(markup, encoding):
        try:
            tree = lxml_html.document_fromstring(markup, parser=lxml_html.HTMLParser(encoding=encoding))
        except (etree.ParserError, ValueError) as exc:
            return type(exc).__name__
        return etree.tostring(tree, encoding=str)

    assert parse(*_markup(text)) == parse(text, None)


@pytest.mark.parametrize("body, ctype, utf8", [
    ("<p>caf\u00e9 \u6771\u4eac</p>".encode(), "text/html", True),
    (b"\xef\xbb\xbf<p>a BOM</p>", "text/html; charset=UTF8", True),
    (b"<p>an unknown charset \xc3\xa9</p>", "text/html; charset=no-such-charset", True),
    ("<p>caf\u00e9</p>".encode("latin-1"), "text/html; charset=iso-8859-1", False),
    (b"<p>a stray \xff byte</p>", "text/html", False),
    ("<p>a real \ufffd in the page</p>".encode(), "text/html", False),
    (b"<?xml version='1.0' encoding='utf-8'?><p>x</p>", "text/html", False),
])
def test_decode_page_hands_its_bytes_to_the_parser_only_when_they_are_the_texts_utf8(body, ctype, utf8):
    from lait.filters.html_pages import _markup, decode_page

    text, _, raw = decode_page({"html": body, "status": 200, "content_type": ctype}, 1000)
    assert (raw is not None) == utf8 and (raw is None or raw == text.encode())
    markup, encoding = _markup(text, raw)
    tree = lxml_html.document_fromstring(markup, parser=lxml_html.HTMLParser(encoding=encoding))
    assert etree.tostring(tree) == etree.tostring(lxml_html.document_fromstring(text))


def test_a_page_stored_without_html_is_dropped_for_what_its_error_says(make_work, td):
    """The crawl's noai page (status 200, no HTML) is clean/noai, not clean/empty."""
    work = make_work()
    errors = {"noai": ("noai", 200), "404": ("http_404", 404), "pdf": ("not_html", 200),
              "dns": ("download/DNSLookupError", 0)}
    rows = [{**td.page_row(f"http://x.test/{name}", b"", status=status), "html": None, "error": error}
            for name, (error, status) in errors.items()]
    rows.append(td.page_row("http://x.test/blank.html", b"  "))
    td.write_table(work, "pages", rows, "url")
    run_clean(work)
    assert {r["page_url"]: r["reason"] for r in work.iter_rows("rejected")} == {
        "http://x.test/noai": "clean/noai", "http://x.test/404": "clean/status", "http://x.test/pdf": "clean/not_html",
        "http://x.test/dns": "clean/download", "http://x.test/blank.html": "clean/empty"}


def test_page_time_limit(make_work, td, monkeypatch):
    import time

    import lait.filters.extract_stage as ts

    def slow(tree):
        time.sleep(5)
        return ""

    monkeypatch.setattr(ts, "_main_text", slow)
    work = make_work()
    td.write_table(work, "pages", [td.page_row(PAGE, ARTICLE)], "url")
    run_clean(work, page_timeout=0.3)
    (row,) = [r for r in work.iter_rows("rejected")]
    assert row["reason"] == "clean/timeout" and row["page_url"] == PAGE


def test_commands_register_and_run(make_work, td, tmp_path):
    work = make_work()
    td.write_table(work, "pages", [td.page_row(PAGE, ARTICLE)], "url")
    td.write_table(work, "images", [td.image_row("http://news.test/a/pics/boat.jpg", td.encode(td.photo(1)))],
                   "image_url")
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    command.register(sub)
    for argv in (["filter", str(work.root), "--workers", "1", "--no-progress", "--min-side", "200"],
                 ["clean", str(work.root), "--workers", "1", "--no-progress", "--languages", "en", "de"]):
        args = parser.parse_args(argv)
        assert args.func(args) == 0
    assert work.count("images_ok") == 1 and work.count("candidates") >= 3
    assert "min_side: 200" in (work.root / "_configs" / "filter.yaml").read_text()
    assert "- de" in (work.root / "_configs" / "clean.yaml").read_text()


def test_rules_off_keeps_what_those_rules_drop_and_only_that(make_work, td):
    """`rules_off` names rules that are not applied: the file name and the site-wide text come
    through with them off, while the rules left on still drop (the one-word alt)."""
    rows = [td.page_row(f"http://blog.test/p{i}.html",
                        f'<html lang="en"><body><img src="/banner.jpg" alt="Welcome to our lovely blog">'
                        f'<img src="/p{i}.jpg" alt="IMG_20{i}1.JPG at the beach"><img src="/q{i}.jpg" alt="untitled"></body></html>')
            for i in range(8)]
    on, off = make_work(name="on"), make_work(name="off")
    for work in (on, off):
        td.write_table(work, "pages", rows, "url")
    run_clean(on)
    run_clean(off, rules_off=["filename", "site_boilerplate", "language"])
    assert {r["image_url"] for r in on.iter_rows("candidates")} == set()
    kept = {r["image_url"]: [t["text"] for t in r["texts"]] for r in off.iter_rows("candidates")}
    assert kept["http://blog.test/banner.jpg"] == ["Welcome to our lovely blog"]
    assert kept["http://blog.test/p3.jpg"] == ["IMG_2031.JPG at the beach"]
    assert "http://blog.test/q3.jpg" not in kept  # the boilerplate rule is still on
    assert {r["reason"] for r in off.iter_rows("rejected") if r["text"] == "untitled"} == {"clean/boilerplate"}


def test_rules_off_refuses_a_rule_it_does_not_know():
    from lait.config import ConfigError

    with pytest.raises(ConfigError, match="unknown rules \\['no_such_rule'\\].*page_text"):
        CleanConfig(work="w", rules_off=["no_such_rule"]).validate()


def test_rules_off_enters_the_fingerprint_only_when_set():
    """A work directory cleaned before `rules_off` existed is not cleaned again for it."""
    assert "rules_off" not in CleanConfig(work="w").output_settings()
    assert CleanConfig(work="w", rules_off=["page_text"]).output_settings()["rules_off"] == ["page_text"]
