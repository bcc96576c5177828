"""The dataset report a builder tunes with (`lait stats --html`, `lait demo`'s report.html), on a
real demo run: the funnel counts one unit per row with shares, every rejection reason shows
examples of what it dropped and the page each came from, stage 5's score threshold is drawn on
the histogram, samples link to their pages; and `lait demo` prints each summary once."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from lait.app.funnel import IMAGES, PAGE_PAIRS, PAGES, TEXT_PAIRS, UNITS, FunnelRow, reason_unit
from lait.app.plots import Threshold
from lait.app.report import gather, thresholds
from lait.workdir import WorkDir

# A page a card came from: a link to its stored copy, or its URL as text; both carry the URL.
PAGE_REF = r'class="page" (?:href="[^"]+" )?data-url="([^"]+)"'
CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_a_reason_counts_the_unit_its_rows_are():
    assert reason_unit("clean/no_text", {"page_url": "p", "image_url": "i"}) == PAGE_PAIRS
    assert reason_unit("clean/boilerplate", {"page_url": "p", "image_url": "i", "text": "click"}) == TEXT_PAIRS
    assert reason_unit("filter/min_side", {"page_url": "p", "image_url": "i"}) == IMAGES
    assert reason_unit("clean/status", {"page_url": "p", "image_url": None}) == PAGES
    # a score cut or an unreadable image names the best text, but drops the picture
    assert reason_unit("build/min_score", {"page_url": "p", "image_url": "i", "text": "a cat"}) == IMAGES
    assert reason_unit("build/unreadable", {"page_url": "p", "image_url": "i", "text": "a cat"}) == IMAGES
    assert reason_unit("build/no_image", {"page_url": "p", "image_url": "i", "text": "a cat"}) == TEXT_PAIRS


def test_shares_are_of_the_units_first_row():
    row = FunnelRow(IMAGES, "kept by filter", 25, "", base=200, base_label="images fetched")
    assert row.share() == "12.5% of images fetched" and FunnelRow(IMAGES, "fetched", 200, "").share() == ""


def test_the_thresholds_drawn_are_the_ones_stage_5_applied():
    assert thresholds({"min_score": None, "top_fraction": 1.0}, [0.5, 0.9]) == []
    assert thresholds({"min_score": 0.28, "top_fraction": 1.0}, [0.5]) == [Threshold(0.28, "min_score 0.28")]
    (cut,) = thresholds({"min_score": None, "top_fraction": 0.3}, [0.7, 0.5, 0.9])
    assert cut.value == 0.5 and cut.label.startswith("top_fraction 0.3")


# -- on a demo run ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo(demo_run):
    out, proc = demo_run
    work = WorkDir(out / "work")
    return out, work, gather(out / "work", examples_per_reason=4), (out / "report.html").read_text()


@pytest.mark.slow
def test_demo_prints_each_stage_summary_once_and_no_third_party_info(demo_run):
    _, proc = demo_run
    err = proc.stderr
    for stage in ("filter", "clean", "score", "build_pick", "build_plan", "build_shards"):
        assert len(re.findall(rf"^{stage}: \d+ done", err, re.M)) == 1, (stage, err)
    loggers = set(re.findall(r"^\S+ (?:INFO|DEBUG) (\S+):", err, re.M))
    assert loggers and all(name.startswith("lait") for name in loggers), loggers
    assert "faiss" not in err


@pytest.mark.slow
def test_the_funnel_counts_one_unit_per_row_and_only_goes_down(demo):
    _, work, st, _ = demo
    assert [u for u in UNITS if any(r.unit == u for r in st.funnel)] == list(UNITS)
    for unit in UNITS:
        rows = [r for r in st.funnel if r.unit == unit]
        counts = [r.count for r in rows]
        assert counts == sorted(counts, reverse=True), (unit, counts)
        for r in rows[1:]:
            assert r.base == rows[0].count and r.percent == pytest.approx(100 * r.count / rows[0].count)
    row = {r.label: r.count for r in st.funnel}
    assert row["images fetched"] == work.count("images") and row["images kept by filter"] == work.count("images_ok")
    assert row["image-page pairs found"] == work.count("candidates") + st.rejects["clean/no_text"]
    assert row["samples in shards"] == len(st.samples) == row["images in shards"]
    # What the issue saw: no_text counted against images. It is its own unit now.
    assert st.reject_units["clean/no_text"] == PAGE_PAIRS and st.reject_units["filter/min_side"] == IMAGES
    assert st.reject_units["clean/boilerplate"] == TEXT_PAIRS


@pytest.mark.slow
def test_every_reason_shows_examples_with_the_page_they_came_from(demo):
    _, work, st, page = demo
    rejected = work.read("rejected").to_pylist()
    pages_of = Counter((r["reason"], r["page_url"]) for r in rejected)
    sections = dict(re.findall(r'<section class="reason" id="[^"]+" data-reason="([^"]+)">(.*?)</section>', page, re.S))
    assert set(sections) == set(st.rejects)
    for reason, body in sections.items():
        figures = re.findall(r'<figure class="example">(.*?)</figure>', body, re.S)
        assert 1 <= len(figures) <= 4 and len(figures) == min(4, st.rejects[reason]), reason
        for fig in figures:
            links = [html.unescape(u) for u in re.findall(PAGE_REF, fig)]
            assert len(links) == 1 and (reason, links[0]) in pages_of, (reason, fig[:300])
    assert "data:image/jpeg;base64," in sections["filter/min_side"]  # an image rule: what the image looked like
    text_rules = [r for r in sections if st.reject_units[r] == TEXT_PAIRS]
    assert text_rules
    for reason in text_rules:  # a text rule: the texts it dropped
        texts = {r["text"] for r in rejected if r["reason"] == reason}
        quoted = {html.unescape(t) for t in re.findall(r"<blockquote>(.*?)</blockquote>", sections[reason])}
        assert quoted and quoted <= texts
    order = [html.unescape(r) for r in re.findall(r'<tr data-reason="([^"]+)">', page)]
    assert order == [r for r, _ in st.sorted_rejects()]


@pytest.mark.slow
def test_the_score_threshold_is_drawn_on_the_histogram(demo):
    _, _, st, page = demo
    assert [t.label for t in st.thresholds] == ["min_score 0.6"]
    histogram = re.search(r'<div id="score-histogram">(<svg.*?</svg>)\s*</div>', page, re.S).group(1)
    assert re.search(r'<g id="threshold-0">', histogram)
    assert "min_score 0.6" in page and min(st.kept_scores) >= 0.6


@pytest.mark.slow
def test_samples_link_to_their_pages_not_to_the_image_host(demo):
    _, _, st, page = demo
    by_key = {s["key"]: s for s in st.samples}
    figures = re.findall(r'<figure class="sample"><img alt="sample ([^"]+)".*?</figure>', page, re.S)
    assert figures
    for key, body in re.findall(r'<figure class="sample"><img alt="sample ([^"]+)"(.*?)</figure>', page, re.S):
        (url,) = re.findall(PAGE_REF, body)
        assert html.unescape(url) == by_key[key]["page_url"] != by_key[key]["url"]


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        pytest.skip("no chromium on PATH (scripts/system-deps.sh installs it; make test runs it)")
    return exe


# Runs in the page after load: what a reader sees, as JSON on <body data-probe="...">.
PROBE = r"""<script>
window.addEventListener('load', () => {
  const visible = e => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const funnel = [...document.querySelectorAll('#funnel tr[data-unit]')].map(tr => ({
    unit: tr.dataset.unit, cells: [...tr.cells].map(td => td.textContent.trim()), shown: visible(tr)}));
  const reasons = [...document.querySelectorAll('section.reason')].map(s => ({
    reason: s.dataset.reason,
    examples: [...s.querySelectorAll('figure.example')].map(f => ({
      image: [...f.querySelectorAll('img')].some(i => i.complete && i.naturalWidth > 0 && visible(i)),
      text: [...f.querySelectorAll('blockquote')].some(b => b.textContent.trim() && visible(b)),
      detail: (f.querySelector('figcaption') || {textContent: ''}).textContent
        .replace(/^page\s+\S+/, '').replace(/\son\s.*$/s, '').trim(),
      page: [...f.querySelectorAll('.page[data-url]')].map(a => a.dataset.url)})),
  }));
  const svg = document.querySelector('#score-histogram svg');
  const line = document.querySelector('#score-histogram [id^="threshold-"]');
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
  document.body.setAttribute('data-probe', JSON.stringify({
    funnel, reasons, svg: svg ? box(svg) : null, line: line ? box(line) : null}));
});
</script>"""


@pytest.mark.slow
def test_the_report_in_headless_chromium_shows_funnel_examples_and_threshold(demo, tmp_path):
    exe = chromium()
    out, _, st, page = demo
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", PROBE + "</body>"))
    dom = subprocess.run([exe, *CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,4000",
                          "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=180).stdout
    seen = json.loads(html.unescape(re.search(r'data-probe="([^"]*)"', dom).group(1)))
    # The funnel: every unit, each row shown with its count, and a share on all but a unit's first row.
    assert [r["unit"] for r in seen["funnel"]] == [r.unit for r in st.funnel]
    for row, expected in zip(seen["funnel"], st.funnel):
        assert row["shown"] and row["cells"][2] == f"{expected.count:,}"
        if expected.base is None:
            assert row["cells"][3] == ""
        else:
            assert re.fullmatch(r"\d{1,3}\.\d%", row["cells"][3]), row
    # Every reason, with examples a reader can see: a decoded thumbnail or a text, and its page.
    assert {r["reason"] for r in seen["reasons"]} == set(st.rejects)
    for r in seen["reasons"]:
        # a page-level reason (crawl/robots, clean/status) or an image without stored bytes has
        # neither thumbnail nor text: its detail says what happened
        assert r["examples"] and all(e["image"] or e["text"] or e["detail"] for e in r["examples"]), r
        assert all(len(e["page"]) == 1 and e["page"][0].startswith("http") for e in r["examples"]), r
    shown = {r["reason"]: r for r in seen["reasons"]}
    assert all(e["image"] for e in shown["filter/min_side"]["examples"])
    assert all(e["text"] for r, seen_r in shown.items() if st.reject_units[r] == TEXT_PAIRS
               for e in seen_r["examples"])
    # The threshold: a vertical line inside the histogram.
    assert seen["line"] is not None, "no threshold line"
    lx, ly, lw, lh = seen["line"]
    sx, sy, sw, sh = seen["svg"]
    assert lh > 5 * max(lw, 1) and sx <= lx <= sx + sw and sy <= ly and ly + lh <= sy + sh


@pytest.mark.slow
def test_the_examples_of_a_reason_come_from_as_many_pages_as_there_are(demo):
    """Issue 52: all four examples of clean/no_text and clean/site_boilerplate were of one page."""
    _, work, st, _ = demo
    pages: dict[str, set] = {}
    for row in work.iter_rows("rejected", columns=["reason", "page_url", "image_url", "text"]):
        pages.setdefault(row["reason"], set()).add(row["page_url"] or row["image_url"] or row["text"])
    several = 0
    for reason, examples in st.examples.items():
        shown = {e.page_url or e.image_url or e.text for e in examples}
        assert len(examples) == min(4, st.rejects[reason]), reason
        assert len(shown) == min(len(examples), len(pages[reason])), (reason, shown)
        several += len(shown) > 1
    assert several >= 5, "too few reasons with more than one page to show it"


@pytest.mark.slow
def test_the_funnel_adds_up_step_by_step(demo):
    """Each step's count is the next step's plus what was dropped there, by reason; every
    rejected row is counted at one step, once."""
    _, _, st, page = demo
    from lait.app.funnel import DERIVED
    from lait.reasons import REASONS

    for before, after in zip(st.funnel, st.funnel[1:]):
        if before.unit == after.unit:
            assert before.count == after.count + sum(after.dropped.values()), (before, after)
    counted = Counter()
    for row in st.funnel:
        assert all(r in REASONS or r in DERIVED for r in row.dropped), row.dropped
        counted.update({r: n for r, n in row.dropped.items() if r in REASONS})
    assert counted == st.rejects
    # What the issue saw: images kept by filter lost on the way to scoring with no reason row.
    steps = {r.step: r for r in st.funnel if r.unit == IMAGES}
    assert steps["with scored texts"].dropped == ({"no text left": steps["kept by filter"].count
                                                   - steps["with scored texts"].count}
                                                  if steps["kept by filter"].count > steps["with scored texts"].count
                                                  else {})
    drops = re.findall(r'<tr class="drop" data-drop="([^"]+)">.*?<td class=n>&minus;([\d,]+)</td>', page)
    assert sum(int(n.replace(",", "")) for _, n in drops) == sum(sum(r.dropped.values()) for r in st.funnel)


# Runs in the report after load: every link, and what each stored copy it links to holds.
LINK_PROBE = r"""<script>
window.addEventListener('load', async () => {
  const links = [...document.querySelectorAll('a[href]')].map(a => ({
    href: a.href, raw: a.getAttribute('href'), url: a.dataset.url || null}));
  const files = [...new Set(links.map(l => l.href.split('#')[0]).filter(h => h.startsWith('file:') && h !== location.href))];
  const opened = {}, inside = {};
  await Promise.all(files.map(h => new Promise(done => {
    const frame = document.createElement('iframe');
    frame.onload = () => {
      try {
        const doc = frame.contentDocument;
        const meta = doc.querySelector('meta[name="lait-stored-copy-of"]');
        opened[h] = meta ? meta.content : 'no copy marker';
        const imgs = [...doc.images];
        inside[h] = {images: imgs.length, drawn: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
                     broken: imgs.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.getAttribute('src')),
                     links: [...doc.querySelectorAll('a[href]')].map(a => ({raw: a.getAttribute('href'), href: a.href}))};
      } catch (e) { opened[h] = 'error: ' + e; }
      done();
    };
    frame.src = h;
    document.body.appendChild(frame);
  })));
  document.body.setAttribute('data-links', JSON.stringify({links, opened, inside}));
});
</script>"""


@pytest.mark.slow
def test_every_link_of_the_report_works_after_the_web_stopped(demo, tmp_path):
    """The demo has ended, its local web with it: the report's page links open the stored
    copies beside it, in-page links have their targets, and nothing points at the web."""
    exe = chromium()
    out, _, st, page = demo
    probe = out / "_link_probe.html"  # beside report.html, so relative links resolve as they do for it
    probe.write_text(page.replace("</body>", LINK_PROBE + "</body>"))
    try:
        dom = subprocess.run([exe, *CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                              "--allow-file-access-from-files", "--virtual-time-budget=20000", "--dump-dom",
                              probe.as_uri()], capture_output=True, text=True, timeout=180).stdout
    finally:
        probe.unlink()
    seen = json.loads(html.unescape(re.search(r'data-links="([^"]*)"', dom).group(1)))
    links, opened = seen["links"], seen["opened"]
    ids = set(re.findall(r'\bid="([^"]+)"', page))
    assert not [lk for lk in links if not lk["href"].startswith("file:")], "links to a web"
    anchors = [lk["raw"][1:] for lk in links if lk["raw"].startswith("#")]
    assert anchors and set(anchors) <= ids
    copies = [lk for lk in links if not lk["raw"].startswith("#")]
    assert len(copies) >= 20  # samples, best and worst pairs, examples
    for lk in copies:
        target = lk["href"].split("#")[0]
        assert (out / lk["raw"]).is_file(), lk
        assert opened[target] == lk["url"], (lk, opened.get(target))  # the copy of the page it names
    # Pages with no stored HTML (robots.txt, 404) are text, not links.
    assert re.search(r'<span class="page" data-url="[^"]+/private/', page)
    # Issue 52: inside each stored copy no image is broken (the stored bytes, or a box saying
    # they are not stored), and every link opens another stored copy, an anchor, or is text.
    inside = seen["inside"]
    assert set(inside) == {lk["href"].split("#")[0] for lk in copies}
    assert all(not c["broken"] for c in inside.values()), {h: c["broken"] for h, c in inside.items() if c["broken"]}
    assert sum(c["drawn"] for c in inside.values()) >= 20  # the demo's photos, drawn from their stored bytes
    own = [lk for c in inside.values() for lk in c["links"]]
    assert own, "the stored pages link nowhere"
    for lk in own:
        assert lk["raw"].startswith("#") or (lk["href"].startswith("file:")
                                             and Path(unquote(urlsplit(lk["href"]).path)).is_file()), lk
    assert any(not lk["raw"].startswith("#") for lk in own)  # some open other copies


def test_stats_counts_faces_searched_per_shipped_sample_and_uses_the_runs_max_unsafe(tmp_path):
    """Issues 47 and 61: `lait stats` counts the face search per shipped sample (stage 5 searches
    each picture as it writes it; a rebuild reuses the searches), with the build's detector and
    threshold, and the report blurs thumbnails at the run's max_unsafe, not the default 0.8.
    The faces found and blurred on real photos are counted by tests/filters/test_faces.py."""
    from kit import build_data as data
    from lait.build.config import BuildConfig
    from lait.build.pipeline import build

    root = tmp_path / "work"
    data.make_work(root, n_partitions=1)
    (root / "_configs").mkdir(exist_ok=True)
    (root / "_configs" / "filter.yaml").write_text("max_unsafe: 0.3\n")
    assert build(BuildConfig(work=str(root), workers=1, progress=False, min_face_score=0.85)).ok
    st = gather(root)
    n = len(st.samples)
    assert n > 5 and st.max_unsafe == 0.3
    assert (st.faces["searched"], st.faces["searched_now"], st.faces["reused"], st.faces["samples"]) == (n, n, 0, n)
    proc = subprocess.run([sys.executable, "-m", "lait", "stats", str(root)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "max_unsafe 0.3 (this run's)" in proc.stdout
    assert (f"faces (mtcnn-faces at min_face_score 0.85, searched as each picture was written): {n:,} of {n:,} "
            f"samples searched; 0 faces on 0 samples, 0 blurred") in proc.stdout
    # Rebuilt with the faces kept sharp: every search is reused, and said so.
    assert build(BuildConfig(work=str(root), workers=1, progress=False, min_face_score=0.85, blur_faces=False)).ok
    js = json.loads(subprocess.run([sys.executable, "-m", "lait", "stats", str(root), "--json"], capture_output=True,
                                   text=True, timeout=120).stdout)
    assert js["max_unsafe"] == 0.3
    assert (js["faces"]["searched"], js["faces"]["reused"], js["faces"]["blur_faces"]) == (n, n, False)


def test_report_thumbnails_are_blurred_above_the_runs_max_unsafe(tmp_path):
    from PIL import Image

    from lait.app.examples import thumbnail

    buf = __import__("io").BytesIO()
    Image.new("RGB", (64, 48), (120, 80, 40)).save(buf, "PNG")
    assert thumbnail(buf.getvalue(), punsafe=0.5, max_unsafe=0.3)[1] is True
    assert thumbnail(buf.getvalue(), punsafe=0.5, max_unsafe=0.8)[1] is False
    assert thumbnail(buf.getvalue(), punsafe=0.5)[1] is False  # the default, when the run's is unknown
