"""Stage 3 keeps captions a user would keep: junk rules with their reasons, page texts given to
one image, language ID over all languages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lait.executor import LocalExecutor
from lait.filters.config import CleanConfig
from lait.filters.langid import detect
from lait.filters.text_stage import CleanStage

PAGE = "http://site.test/story.html"
BENCH = Path(__file__).resolve().parents[2] / "bench" / "captions"


def run_clean(make_work, td, html: str, **settings) -> tuple[dict[str, list[dict]], list[dict]]:
    """(image URL -> candidate texts, rejected rows) of one page through CleanStage."""
    work = make_work()
    td.write_table(work, "pages", [td.page_row(PAGE, html)], "url")
    cfg = CleanConfig(work=str(work.root), progress=False, **settings)
    assert LocalExecutor(workers=1, show_progress=False).run(CleanStage(cfg), work).ok
    got = {r["image_url"]: r["texts"] for r in work.iter_rows("candidates")}
    return got, list(work.iter_rows("rejected"))


def page(body: str, head: str = "") -> str:
    return f"<!DOCTYPE html><html lang='en'><head>{head}</head><body>{body}</body></html>"


@pytest.mark.parametrize("text, reason", [
    ("Share on Facebook", "clean/social"),
    ("Follow us on Twitter @Spacedotcom or Facebook.", "clean/social"),
    ("(Credit: Jane Doe / Example News)", "clean/credit"),
    ("Photo: Reuters", "clean/credit"),
    ("Courtesy Google", "clean/credit"),
    ("By Xabi Vazquez (Flickr: game boy color) [CC BY 2.0], via Wikimedia Commons", "clean/credit"),
    ("Posted by Andrew Hayden, Software Engineer on Google Play", "clean/credit"),
    ("Sign up for our newsletter to get the best stories in your inbox", "clean/promo"),
    ("We use cookies to give you the best experience on our website", "clean/promo"),
    ("Disclosure: Example may earn a commission from products featured on this page.", "clean/promo"),
    ("Use code SAVE50 to get it for $799", "clean/promo"),
    ("You may also like:", "clean/navigation"),
    ("READ MORE: Two diagnosed with plague in Beijing", "clean/navigation"),
    ("External links[edit]", "clean/navigation"),
    ("1909 Jolinda Drive, Springfield, IL 62704", "clean/contact"),
    ("Call our newsroom on 020 7946 0958 with tips", "clean/contact"),
    ("Write to letters@thetimes.news", "clean/contact"),
    ("Police close the road after the storm 2 hours ago", "clean/date"),
    ("8 November 2019", "clean/date"),
    ("Updated Nov. 19, 2019 10:42 AM ET", "clean/date"),
    ("{\\displaystyle A^{\\mathsf {H}}}", "clean/markup"),
    ("Lorem ipsum dolor sit amet, consectetur adipiscing elit.", "clean/markup"),
    ("Snopes Logo", "clean/boilerplate"),
    # A short text that calls its picture a logo or a banner anywhere (unseen.json's junk, issue 62).
    ("Logo Capital Digital", "clean/boilerplate"),
    ("Trust Logos for FinCompare", "clean/boilerplate"),
    ("EUROVIA Verkehrsbau Union GmbH-Firmenlogo", "clean/boilerplate"),
    ("Belize Weather Banner - Travellers Liquor", "clean/boilerplate"),
])
def test_junk_is_dropped_with_its_reason(make_work, td, text, reason):
    html = page(f'<img src="/junk.jpg" alt="{text}"><img src="/ok.jpg" alt="A red fox crossing a snowy field">')
    got, rejected = run_clean(make_work, td, html, languages=["any"])
    assert [t["text"] for t in got["http://site.test/ok.jpg"]] == ["A red fox crossing a snowy field"]
    assert "http://site.test/junk.jpg" not in got
    assert (reason, text) in {(r["reason"], r["text"]) for r in rejected}


@pytest.mark.parametrize("caption", [
    "Smoke billows from a chimney near Milan, Italy. (AP Photo/Luca Bruno)",
    "Scooter Braun and Scott Borchetta pose for a photo on June 28, 2019 in Montecito, California.",
    "Man checking phone in front of Twitter logo. - Chris Ratcliffe/Bloomberg",
    "Customer looks at Obama shirts at a stall in Nairobi's Kibera slums, 23 July 2015",
    "A bike parked under a traffic light next to a blue sign.",
])
def test_captions_with_credits_dates_or_brand_names_are_kept(make_work, td, caption):
    got, _ = run_clean(make_work, td, page(f'<img src="/a.jpg" alt="{caption}">'))
    assert [t["text"] for t in got["http://site.test/a.jpg"]] == [caption]


def test_og_texts_go_with_the_first_og_image_only(make_work, td):
    head = ('<meta property="og:image" content="/og1.jpg"><meta property="og:image" content="/og2.jpg">'
            '<meta property="og:image" content="/og3.jpg">'
            '<meta property="og:description" content="What is Creative Commons and how do its licences work?">')
    got, rejected = run_clean(make_work, td, page('<p>Hello.</p>', head), languages=["any"])
    assert [t["text"] for t in got["http://site.test/og1.jpg"]] == [
        "What is Creative Commons and how do its licences work?"]
    assert set(got) == {"http://site.test/og1.jpg"}
    dropped = {r["image_url"] for r in rejected if r["reason"] == "clean/page_text"}
    assert dropped == {"http://site.test/og2.jpg", "http://site.test/og3.jpg"}


def test_a_text_given_to_several_images_stays_with_its_owner(make_work, td):
    headline = "Illustration for article titled The Spectacular Story Of Metroid"
    body = (f'<img src="/1.jpg" alt="{headline}"><img src="/2.jpg" alt="{headline}">'
            f'<figure><img src="/3.jpg"><figcaption>{headline}</figcaption></figure>'
            f'<img src="/4.jpg" alt="{headline}" srcset="/4-big.jpg 2x">')
    got, rejected = run_clean(make_work, td, page(body), languages=["any"], sources=["alt", "figcaption"])
    # The figcaption is the strongest claim: the text belongs to the third image alone.
    assert {u: [t["text"] for t in ts] for u, ts in got.items()} == {"http://site.test/3.jpg": [headline]}
    dropped = {r["image_url"] for r in rejected if r["reason"] == "clean/page_text"}
    assert dropped == {f"http://site.test/{n}.jpg" for n in ("1", "2", "4", "4-big")}


def test_a_paragraph_between_images_is_the_context_of_the_nearest(make_work, td):
    para = ("Then the tribe moves in en masse and holds a karakia, names each animal and sets to work "
            "removing their bones for cultural purposes.")
    body = ('<article><h1>Whales</h1>' + '<p>The coast was quiet that year, and nobody expected what came next '
            'in the long summer.</p>' * 3 + '<img src="/a.jpg" alt="A beached sperm whale">'
            f'<p>{para}</p><img src="/b.jpg" alt="Whale bones in a shed">' + '<p>More of the story, and more still, to make it an '
            'article that trafilatura keeps.</p>' * 3 + '</article>')
    got, rejected = run_clean(make_work, td, page(body), languages=["any"], context_window=3)
    owners = [u for u, ts in got.items() if any(t["text"] == para for t in ts)]
    assert owners == ["http://site.test/a.jpg"]  # as near to both: the first in the page
    assert any(r["reason"] == "clean/page_text" and r["image_url"] == "http://site.test/b.jpg" for r in rejected)


def test_a_figure_nested_in_another_keeps_its_caption_to_itself(make_work, td):
    body = ('<figure><img src="/real.jpg"><figcaption>Cells with taste receptors in the lungs.</figcaption>'
            '<figure class="lait-planted"><img src="/coco.jpg"><figcaption>A teddy bear placed on a bench.'
            '</figcaption></figure></figure>')
    got, _ = run_clean(make_work, td, page(body), languages=["any"])
    assert [t["text"] for t in got["http://site.test/real.jpg"]] == ["Cells with taste receptors in the lungs."]
    assert [t["text"] for t in got["http://site.test/coco.jpg"]] == ["A teddy bear placed on a bench."]


def test_a_text_that_is_the_sites_name_is_boilerplate(make_work, td):
    head = '<title>Bike style book - Motor Cycle Monthly</title><meta property="og:site_name" content="Tech Insider">'
    body = ('<img src="/a.jpg" alt="Motor Cycle Monthly"><img src="/b.jpg" alt="Tech Insider">'
            '<img src="/c.jpg" alt="A motorcycle parked by the sea">')
    got, rejected = run_clean(make_work, td, page(body, head), languages=["any"])
    assert set(got) == {"http://site.test/c.jpg"}
    assert {r["text"] for r in rejected if r["reason"] == "clean/boilerplate"} == {"Motor Cycle Monthly", "Tech Insider"}


# -- language ID -----------------------------------------------------------------------------------

def _written() -> dict[str, list[str]]:
    return {k: v for k, v in json.loads((BENCH / "langid_written.json").read_text(encoding="utf-8")).items()
            if not k.startswith("_")}


@pytest.mark.parametrize("lang", ["pl", "cs", "nl", "id", "tr"])
def test_short_texts_of_other_languages_are_not_tagged_english(lang):
    texts = _written()[lang]
    if lang == "pl":  # the texts the issue found kept by --languages en
        texts = texts + ["Obyczaje polskie. Szczątki", "Jak Polacy spędzają czas wolny w pandemii i lockdownie?"]
    tagged = {t: detect(t)[0] for t in texts}
    assert not [t for t, code in tagged.items() if code == "en"], tagged
    assert sum(code == lang for code in tagged.values()) >= 0.5 * len(texts), tagged


def test_english_captions_are_english_also_in_capitals():
    for text in ("A PERSON IS SKIING ON THE SLOPE", "Hong Kong protesters", "A dog on the beach at sunset"):
        assert detect(text)[0] == "en", text


def test_language_setting_takes_any_code_the_detector_knows(tmp_path):
    from lait.config import ConfigError

    CleanConfig(work=str(tmp_path), languages=["en", "pl", "nb", "ceb"]).validate()
    with pytest.raises(ConfigError, match="unknown language codes"):
        CleanConfig(work=str(tmp_path), languages=["english"]).validate()


def test_polish_caption_dropped_by_languages_en(make_work, td):
    body = ('<img src="/pl.jpg" alt="Jak Polacy spędzają czas wolny w pandemii i lockdownie?">'
            '<img src="/en.jpg" alt="Two children playing football in the park">')
    got, rejected = run_clean(make_work, td, page(body))
    assert set(got) == {"http://site.test/en.jpg"} and got["http://site.test/en.jpg"][0]["lang"] == "en"
    assert any(r["reason"] == "clean/language" and r["detail"] == "language pl" for r in rejected)


def test_list_rows_whose_image_was_never_fetched_give_no_stage3_rows(make_work, td):
    """A list row whose image has no bytes (an unreachable host, a failed download, no images/
    row at all) is stage 1's failure: stage 3 neither cleans its caption nor rejects it."""
    work = make_work(n_partitions=2)
    urls = {k: f"http://photos.test/{k}.jpg" for k in ("ok", "failed", "absent")}
    td.write_table(work, "url_list", [{"image_url": u, "caption": "x", "page_url": None, "extra": None,
                                       "list_file": "l.csv", "row": i + 1} for i, u in enumerate(urls.values())],
                   "image_url")
    failed = {**td.image_row(urls["failed"], None, status=0), "error": "download/DownloadConnectionRefusedError"}
    td.write_table(work, "images", [td.image_row(urls["ok"], td.encode(td.photo(2))), failed], "image_url")
    cfg = CleanConfig(work=str(work.root), progress=False, languages=["en"])
    assert LocalExecutor(workers=1, show_progress=False).run(CleanStage(cfg), work).ok
    rows = list(work.iter_rows("rejected")) + list(work.iter_rows("candidates"))
    # the fetched image's one-letter caption is judged (and rejected); the others are not seen
    assert {r["image_url"] for r in rows} == {urls["ok"]}


def test_with_page_text_off_every_image_keeps_the_texts_the_page_gives_it(make_work, td):
    """`rules_off: [page_text]` (a raw pool, `lait demo --raw-pool`): the headline stays on every
    image that offers it, the og texts on every og image, and nothing is dropped as page_text."""
    headline = "Illustration for article titled The Spectacular Story Of Metroid"
    body = (f'<img src="/1.jpg" alt="{headline}"><img src="/2.jpg" alt="{headline}">'
            f'<figure><img src="/3.jpg"><figcaption>{headline}</figcaption></figure>')
    head = ('<meta property="og:image" content="/og1.jpg"><meta property="og:image" content="/og2.jpg">'
            '<meta property="og:description" content="What is Creative Commons and how do its licences work?">')
    got, rejected = run_clean(make_work, td, page(body, head), languages=["any"],
                              sources=["alt", "figcaption", "og"], rules_off=["page_text"])
    assert {u: [t["text"] for t in ts] for u, ts in got.items() if not u.startswith("http://site.test/og")} == {
        f"http://site.test/{n}.jpg": [headline] for n in ("1", "2", "3")}
    assert [t["text"] for t in got["http://site.test/og2.jpg"]] == [t["text"] for t in got["http://site.test/og1.jpg"]]
    assert not [r for r in rejected if r["reason"] == "clean/page_text"]


@pytest.mark.parametrize("text, dropped", [
    ("Monday, 10:30 a.m. GMT", True),
    ("Sept. 12th, 2015 at 10:30pm", True),
    ("published yesterday", True),
    ("12/03/2019 — 10:30", True),  # beyond ASCII: the dash
    ("Wednesday 9 September 2015", True),
    ("A storm in September 2015", False),
    ("12 September 2015 — the storm", False),
    ("Überraschungsparty, 12. Dezember", False),
])
def test_a_text_made_only_of_date_parts_is_a_date(text, dropped):
    from lait.filters.text_junk import DateFilter
    from lait.filters.text_rules import Candidate

    verdict = DateFilter().keep(Candidate(text, "alt", "i", "p"))
    assert (verdict == (False, "only a date")) is dropped, verdict


@pytest.mark.parametrize("text, match", [
    ("Read more about the storm", "Read more"),
    ("Back to top", "Back to top"),
    ("[edit]", "[edit]"),
    ("History of the bridge [edit]", "[edit]"),
    ("Tooltip: drag to rotate", "Tooltip"),
    ("Hover the tooltip to see the date", "tooltip"),
    ("12 comments", "12 comments"),
    ("Print page", "Print page"),
    ("A reader waves from the back of the boat", None),
    ("Cars queue at the border, edit this later", None),
])
def test_navigation_texts_are_found_at_their_start_or_anywhere(text, match):
    from lait.filters.text_junk import NavigationFilter
    from lait.filters.text_rules import Candidate

    verdict = NavigationFilter().keep(Candidate(text, "alt", "i", "p"))
    assert verdict == (True if match is None else (False, match))


@pytest.mark.parametrize("rule, text, match", [
    ("PromoFilter", "Abonnez-vous à notre newsletter", "newsletter"),  # beyond ASCII: the pattern decides
    ("PromoFilter", "SIGN UP FOR OUR DAILY BRIEFING", "SIGN UP"),
    ("PromoFilter", "Story continues below advertisement", "continues below advertisement"),
    ("PromoFilter", "A man walks past an advertisement for soap", None),
    ("PromoFilter", "A designer signs the hull of the boat", None),
    ("SocialFilter", "Follow us on Twitter ✓", "Follow us on Twitter"),  # beyond ASCII
    ("SocialFilter", "Share this", "Share"),
    ("SocialFilter", "A woman reads her e-mail on a train", None),
    ("SocialFilter", "Storm clouds over the harbour", None),
])
def test_promo_and_social_rules_drop_what_their_patterns_match(rule, text, match):
    from lait.filters import text_junk
    from lait.filters.text_rules import Candidate

    verdict = getattr(text_junk, rule)().keep(Candidate(text, "alt", "i", "p"))
    assert verdict == (True if match is None else (False, match))
