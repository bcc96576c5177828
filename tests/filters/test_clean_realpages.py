"""Acceptance 2 on real pages: figcaptions of ../shared/data/html/readability become candidates."""

from __future__ import annotations

import ftfy
from lxml import html as lxml_html

from lait.filters.text_stage import CleanConfig, CleanStage
from lait.executor import LocalExecutor
from lait.pagereader import resolve


def _norm(text: str) -> str:
    # Letters and digits only: pages glue caption and credit ("weather.Credit") where the
    # candidate has a space, and that is not a difference in the caption.
    return "".join(ch for ch in ftfy.fix_text(text or "").lower() if ch.isalnum())


def expected_figcaptions(html: bytes, page_url: str) -> list[tuple[str, str]]:
    """(image URL from src, figcaption text) for every <figure> with an <img> and a caption."""
    tree = lxml_html.document_fromstring(html)
    base = (tree.xpath("//base/@href") or [page_url])[0]
    out = []
    for fig in tree.iter("figure"):
        caption = _norm(" ".join(c.text_content() for c in fig.iter("figcaption")))
        if not caption:
            continue
        for img in fig.iter("img"):
            url = resolve(resolve(page_url, base) or page_url, img.get("src"))
            if url:
                out.append((url, caption))
    return out


def test_readability_figcaptions_are_candidates(shared_data, make_work, td):
    root = shared_data / "html" / "readability"
    work = make_work(n_partitions=2)
    rows, expected = [], []
    for d in sorted(p for p in root.iterdir() if (p / "source.html").exists()):
        url = f"http://readability.test/{d.name}/index.html"
        body = (d / "source.html").read_bytes()
        rows.append(td.page_row(url, body))
        expected += [(url, *e) for e in expected_figcaptions(body, url)]
    td.write_table(work, "pages", rows, "url")
    cfg = CleanConfig(work=str(work.root), progress=False, languages=["any"], sources=["figcaption"])
    assert LocalExecutor(workers=2, show_progress=False).run(CleanStage(cfg), work).ok
    got: dict[tuple[str, str], list[str]] = {}
    for r in work.iter_rows("candidates"):
        got[(r["page_url"], r["image_url"])] = [_norm(t["text"]) for t in r["texts"] if t["source"] == "figcaption"]
    assert len(expected) >= 20
    missed = [(p, u, cap) for p, u, cap in expected
              if not any(c in cap or cap in c for c in got.get((p, u), []))]
    share = 1 - len(missed) / len(expected)
    print(f"figcaptions recovered: {len(expected) - len(missed)}/{len(expected)} = {share:.3f}")
    assert share >= 0.95, missed[:10]


def test_planted_coco_captions_are_candidates_of_their_photos(shared_data, make_work, td):
    """Acceptance 2, real-web mode: real pages with planted COCO photo + human caption figures."""
    from lait.testkit.realweb import RealWebSite

    site = RealWebSite(shared_data)
    truth = site.ground_truth()
    base = "http://127.0.0.1:8000"
    work = make_work(n_partitions=4)
    rows, expected = [], []
    for path, page in truth["pages"].items():
        if path == "/":
            continue
        url = base + path
        rows.append(td.page_row(url, site.route(path).body))
        expected += [(url, base + ref["url"], _norm(ref["true_caption"]))
                     for ref in page["images"] if ref["true_caption"]]
    td.write_table(work, "pages", rows, "url")
    cfg = CleanConfig(work=str(work.root), progress=False)
    assert LocalExecutor(workers=2, show_progress=False).run(CleanStage(cfg), work).ok
    got = {(r["page_url"], r["image_url"]): [_norm(t["text"]) for t in r["texts"]]
           for r in work.iter_rows("candidates")}
    assert len(expected) >= 300
    missed = [e for e in expected if not any(e[2] == c for c in got.get(e[:2], []))]
    share = 1 - len(missed) / len(expected)
    assert share >= 0.98, (share, missed[:5])
