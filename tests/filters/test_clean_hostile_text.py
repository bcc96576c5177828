"""Issue 29, hostile text: script, style and noscript content never becomes a text, and bidi
control characters are removed from every text stage 3 keeps (captions of pages and of lists)."""

from __future__ import annotations

from lxml import html as lxml_html

from lait.executor import LocalExecutor
from lait.filters.config import CleanConfig
from lait.filters.extract_stage import read_page_texts
from lait.filters.html_images import find_images, visible_text
from lait.filters.text_rules import repair
from lait.filters.text_stage import CleanStage

PAGE = "http://news.test/a/story.html"
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"


def texts_of(html: str) -> dict[str, list[tuple[str, str]]]:
    cfg = CleanConfig(work="w", languages=["any"])
    found = read_page_texts({"url": PAGE, "status": 200, "html": html.encode(), "encoding": "utf-8",
                             "content_type": "text/html; charset=utf-8"}, cfg)
    return dict(found.images)


def test_a_script_inside_a_figcaption_is_no_part_of_the_caption():
    html = ('<html><body><figure><img src="/dog.jpg"><figcaption><script>alert(1)</script>A dog'
            '<style>.x{color:red}</style><noscript>Enable JavaScript</noscript><!-- hidden note --></figcaption>'
            '</figure></body></html>')
    (image,) = find_images(lxml_html.document_fromstring(html), PAGE)
    assert image.texts == [("figcaption", "A dog")]


def test_script_style_and_noscript_text_never_reach_the_context():
    paragraph = ("The harbour was quiet in the morning light and the boats lay still on the water. "
                 "<script>var caption = 'alert(document.cookie)';</script>"
                 "<noscript>Please enable JavaScript to read this story in full.</noscript>"
                 "<style>p{color:red}</style>Fishermen mended their nets on the quay before noon.")
    html = (f"<html><body><article><h1>The harbour</h1><p>{paragraph}</p><img src='/boat.jpg' alt='A boat'>"
            f"<p>{paragraph}</p><p>The wind rose in the afternoon and the boats came back to the harbour.</p>"
            "</article></body></html>")
    texts = texts_of(html)["http://news.test/boat.jpg"]
    joined = " ".join(t for _, t in texts)
    assert ("alt", "A boat") in texts and any(s == "context" for s, _ in texts)
    for word in ("alert", "cookie", "JavaScript", "color"):
        assert word not in joined, texts


def test_visible_text_is_text_content_where_there_is_nothing_to_hide():
    el = lxml_html.fragment_fromstring("<p>One <b>bold</b> word<!-- c --> here</p>")
    assert visible_text(el) == el.text_content() == "One bold word here"
    el = lxml_html.fragment_fromstring("<p>One <script>x()</script><b>bold <style>s</style>word</b></p>")
    assert visible_text(el) == "One bold word"


def test_visible_text_keeps_the_tails_of_hidden_elements_and_nothing_inside_them():
    tree = lxml_html.document_fromstring(
        "<html><body><div>Before <noscript>no <script>x()</script>script</noscript> after "
        "<style>p {}</style><template><p>t</p></template>end</div>"
        "<noscript><p>Fallback <script>y()</script>text</p></noscript></body></html>")
    div = next(tree.iter("div"))
    assert visible_text(div) == "Before  after end"
    # A paragraph inside a <noscript> is hidden as a whole, as its page shows none of it.
    fallback = [el for el in tree.iter("p") if el.text == "Fallback "]
    assert len(fallback) == 1 and visible_text(fallback[0]) == ""
    assert visible_text(tree) == "Before  after end"
    assert "x()" in div.text_content()  # the tree itself is left as it was


def test_bidi_controls_are_removed_where_texts_are_normalised():
    assert repair(f"A red{BIDI} bus\u202e gnp.exe\u202c") == "A red bus gnp.exe"
    assert not set(BIDI) & set(repair("\u2067مرحبا\u2069 world\u200f"))


def test_bidi_controls_leave_no_trace_in_candidates(make_work, td):
    work = make_work()
    html = (f"<html><body><figure><img src='/a.jpg' alt='A red\u202e bus on a wet street'>"
            f"<figcaption>\u2066Two dogs\u2069 running\u200f in the snow</figcaption></figure></body></html>")
    td.write_table(work, "pages", [td.page_row(PAGE, html)], "url")
    td.write_table(work, "url_list", [{"image_url": "http://news.test/b.jpg", "caption": "A cat\u061c asleep\u202d on a sofa",
                                       "page_url": None, "extra": None, "list_file": "l.csv", "row": 1}], "image_url")
    td.write_table(work, "images", [td.image_row("http://news.test/b.jpg", td.encode(td.photo(1)))], "image_url")
    cfg = CleanConfig(work=str(work.root), progress=False, languages=["any"])
    report = LocalExecutor(workers=1, retries=0, show_progress=False).run(CleanStage(cfg), work)
    assert report.ok, report.summary()
    texts = {t["text"] for r in work.iter_rows("candidates") for t in r["texts"]}
    assert {"A red bus on a wet street", "Two dogs running in the snow", "A cat asleep on a sofa"} <= texts
    assert not any(set(BIDI) & set(t) for t in texts)
