"""Acceptance 1: stages 2 and 3 against the ground truth of the built-in local web.

The `pages` and `images` tables are written from the site's own routes (what a polite crawl of
it fetches: no robots-disallowed or noai pages, no noai images), in document order.
"""

from __future__ import annotations

import pytest

from lait.executor import LocalExecutor
from lait.filters.config import CleanConfig, FilterConfig
from lait.filters.image_stage import ImageFilterStage
from lait.filters.text_stage import CleanStage

generator = pytest.importorskip("lait.testkit.generator")
BASE = "http://shapes.test"


@pytest.fixture(scope="module")
def site_work(tmp_path_factory):
    from lait.workdir import WorkDir

    site = generator.generate_site(40, seed=3)
    gt = site.ground_truth()
    work = WorkDir(tmp_path_factory.mktemp("localweb") / "work", n_partitions=1).init()
    import importlib.util
    import pathlib

    spec = importlib.util.spec_from_file_location("filters_conftest", pathlib.Path(__file__).with_name("conftest.py"))
    td = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(td)
    pages, images = [], []
    for path, page in gt["pages"].items():
        if page["disallowed"] or page["noai"]:
            continue
        r = site.route(path, BASE)
        pages.append(td.page_row(BASE + path, r.body, content_type=r.content_type))
    for url, info in gt["images"].items():
        if info["reason"] and info["reason"].startswith("crawl/") and info["reason"] != "crawl/status_404":
            continue
        r = site.route(url, BASE)
        images.append(td.image_row(BASE + url, r.body if r.status == 200 else None, status=r.status,
                                   mime=r.content_type))
    td.write_table(work, "pages", pages, "url")
    td.write_table(work, "images", images, "image_url")
    return site, gt, work


def test_stage2_matches_ground_truth(site_work):
    site, gt, work = site_work
    cfg = FilterConfig(work=str(work.root), progress=False, dedup=True)  # the ground truth's stage 2 verdicts
    assert LocalExecutor(workers=1, show_progress=False).run(ImageFilterStage(cfg), work).ok
    kept = {r["image_url"][len(BASE):] for r in work.iter_rows("images_ok", columns=["image_url"])}
    rejected = {r["image_url"][len(BASE):]: r["reason"] for r in work.iter_rows("rejected")
                if r["reason"].startswith("filter/")}
    expected_keep = {u for u, i in gt["images"].items() if i["keep"]}
    assert kept == expected_keep
    for url, info in gt["images"].items():
        if info["keep"] or info["reason"] in ("crawl/robots", "crawl/noai", "crawl/noai_page"):
            continue
        want = "filter/status" if info["reason"] == "crawl/status_404" else info["reason"]
        assert rejected.get(url) == want, url
    assert {"filter/min_side", "filter/aspect_ratio", "filter/uninformative", "filter/duplicate_sha256",
            "filter/duplicate_phash", "filter/status"} <= set(rejected.values())


def _candidates(work):
    out: dict[tuple[str, str], list[dict]] = {}
    for r in work.iter_rows("candidates"):
        out[(r["page_url"][len(BASE):], r["image_url"][len(BASE):])] = r["texts"]
    return out


@pytest.mark.parametrize("languages", [["en", "de", "fr"], ["en"]])
def test_stage3_recovers_true_captions_and_drops_junk(site_work, languages):
    site, gt, work = site_work

    # a fresh run per setting: the clean stage's parts and marker are removed first
    import shutil

    for d in ("candidates", "_done/clean"):
        shutil.rmtree(work.root / d, ignore_errors=True)
    for p in (work.root / "rejected").glob("*clean*"):
        p.unlink()
    cfg = CleanConfig(work=str(work.root), progress=False, languages=languages)
    assert LocalExecutor(workers=1, show_progress=False).run(CleanStage(cfg), work).ok
    cands = _candidates(work)
    junk = set(gt["junk_texts"])
    checked = 0
    for path, page in gt["pages"].items():
        if page["disallowed"] or page["noai"]:
            continue
        for ref in page["images"]:
            texts = [t["text"] for t in cands.get((path, ref["url"]), [])]
            assert not junk & set(texts), (path, ref["url"], junk & set(texts))
            info = gt["images"][ref["url"]]
            if not info["keep"] or not ref["true_caption"]:
                continue
            if page["lang"] not in languages:
                assert not any(ref["true_caption"] in t for t in texts)
                continue
            checked += 1
            assert any(ref["true_caption"] in t for t in texts), (path, ref, texts)
    assert checked > 20
    reasons = {r["reason"] for r in work.iter_rows("rejected")}
    assert {"clean/boilerplate", "clean/filename"} <= reasons
    if languages == ["en"]:
        assert "clean/language" in reasons
