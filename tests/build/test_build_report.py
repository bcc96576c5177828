"""`lait stats`: the text summary and the offline HTML report, rendered in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from PIL import Image

from kit import build_data as data  # noqa: E402
from lait.app.report import summary_text, write_report
from lait.build.config import BuildConfig
from lait.build.pipeline import build

CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Counts, after load, the images that decoded (naturalWidth > 0) per section of the page.
PROBE = """<script>
window.addEventListener('load', () => {
  const ok = sel => [...document.querySelectorAll(sel)].filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.setAttribute('data-plots', ok('#plots img'));
  document.body.setAttribute('data-samples', ok('.grid.samples img'));
  document.body.setAttribute('data-external', [...document.querySelectorAll('img,script,link')]
    .filter(e => (e.src || e.href || '').match(/^https?:/)).length);
});
</script>"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("work")
    data.make_work(root)
    assert build(BuildConfig(work=str(root), workers=1, progress=False, samples_per_shard=16)).ok
    st, page = write_report(root, root / "report.html")
    return root, st, page


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        pytest.skip("no chromium on PATH (scripts/system-deps.sh installs it)")
    return exe


def test_summary_text_has_funnel_and_reasons(report):
    _, st, _ = report
    text = summary_text(st)
    assert re.search(r"samples in shards\s+42\b", text)
    for reason in ("build/duplicate_sha256", "build/too_many_pages", "build/unreadable"):
        assert re.search(rf"{re.escape(reason)}\s+1\b", text)


def test_the_funnel_adds_up_with_every_rule_of_stage_5(report):
    """Each of stage 5's rules drops a picture, an unreadable one included (its row names the
    caption): the images step and the captions step both add up."""
    _, st, _ = report
    for before, after in zip(st.funnel, st.funnel[1:]):
        if before.unit == after.unit:
            assert before.count == after.count + sum(after.dropped.values()), (before, after)
    shards = [r for r in st.funnel if r.unit == "images" and r.step == "in shards"][0]
    assert shards.dropped["build/unreadable"] == 1 and shards.dropped["build/too_many_pages"] == 1
    assert st.reject_units["build/unreadable"] == "images"


def test_page_is_self_contained(report):
    _, st, page = report
    text = page.read_text()
    assert not re.search(r'(src|srcset)="https?:|url\(https?:', text)  # URLs are links and text, never loads
    assert len(re.findall(r'src="data:image/png;base64,', text)) >= 8
    assert len(re.findall(r'<figure class="sample"><img alt="[^"]*" src="data:image/jpeg;base64,', text)) >= 24
    assert "build/too_many_texts" in text


def test_report_renders_in_headless_chromium(report, tmp_path):
    exe = chromium()
    _, _, page = report
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    flags = CHROME_FLAGS + [f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([exe, *flags, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    plots = int(re.search(r'data-plots="(\d+)"', dom).group(1))
    samples = int(re.search(r'data-samples="(\d+)"', dom).group(1))
    assert plots >= 8 and samples == 24
    assert re.search(r'data-external="0"', dom)
    shot = tmp_path / "shot.png"
    subprocess.run([exe, *flags, f"--screenshot={shot}", "--window-size=1280,8000", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    with Image.open(shot) as im:
        # A rendered page with plots and photos has thousands of colours; a blank one has a few.
        assert len(im.convert("RGB").getcolors(1 << 20) or []) > 2000
