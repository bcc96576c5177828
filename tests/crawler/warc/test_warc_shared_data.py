"""The real archives of ../shared/data/warc: Common Crawl, warcio's and pywb's test files."""

from __future__ import annotations

import pytest

from lait.crawler.warc_ingest import ingest_files
from lait.workdir import WorkDir


def test_common_crawl_wikipedia_page_and_its_image_references(shared_data, tmp_path):
    files = sorted((shared_data / "warc" / "commoncrawl").glob("*.gz"))
    assert len(files) == 3  # WARC, WAT, WET
    reports = ingest_files(files, tmp_path / "W", workers=1, show_progress=False)
    assert not any(r.failed or r.damage for r in reports)
    work = WorkDir(tmp_path / "W")
    pages = work.read("pages").to_pylist()
    assert [p["url"] for p in pages] == ["https://an.wikipedia.org/wiki/Escopete"]
    assert pages[0]["status"] == 200 and b"Escopete" in pages[0]["html"]
    links = [r for r in work.read("warc_links").to_pylist() if r["source"] == "html"]
    assert {r["page_url"] for r in links} == {"https://an.wikipedia.org/wiki/Escopete"}
    html_imgs = pages[0]["html"].count(b"<img")
    img_urls = {r["image_url"] for r in links}
    # Every <img> of the page becomes a reference (og:image entries add a few more rows).
    assert html_imgs >= 11 and len(img_urls) >= html_imgs
    assert all(u.startswith("https://") for u in img_urls)
    alts = {r["alt"] for r in links}
    assert "Escopete ubicada en Castiella-La Mancha" in alts and "Escudo d'armas" in alts
    assert "https://upload.wikimedia.org/wikipedia/commons/thumb/9/9c/Castilla-La_Mancha-loc.svg/" \
           "250px-Castilla-La_Mancha-loc.svg.png" in img_urls


def test_every_malformed_warcio_file_is_recorded_and_none_aborts(shared_data, tmp_path):
    d = shared_data / "warc" / "warcio"
    files = sorted(p for p in d.iterdir() if p.name != "LICENSE")
    bad = [p for p in files if any(k in p.name for k in ("-bad", "-trunc", "-wrong-chunks"))]
    assert len(bad) >= 4
    reports = ingest_files(files, tmp_path / "W", workers=2, show_progress=False)
    by_name = {r.path.rsplit("/", 1)[1]: r for r in reports}
    assert not any(r.failed for r in reports)
    for p in bad:
        assert by_name[p.name].damage, f"{p.name}: damage not recorded"
    work = WorkDir(tmp_path / "W")
    rej = work.read("rejected").to_pylist()
    for p in bad:
        assert any(r["reason"].startswith("ingest/") and p.name in (r["detail"] or "") for r in rej), p.name
    # The readable records are still ingested: example pages from the damaged files too.
    for name in ("example-bad-non-chunked.warc.gz", "example-wrong-chunks.warc.gz", "example.warc.gz"):
        assert by_name[name].pages >= 1, name
    assert by_name["example.warc.gz"].damage == []


def test_pywb_iana_html_pages_and_png_images(shared_data, tmp_path):
    path = shared_data / "warc" / "pywb" / "iana.warc.gz"
    (report,) = ingest_files([path], tmp_path / "W", workers=1, show_progress=False)
    assert report.damage == [] and report.records == 343
    work = WorkDir(tmp_path / "W")
    pages = [p for p in work.read("pages").to_pylist() if p["status"] == 200]
    assert len({p["url"] for p in pages}) >= 15
    assert all(p["html"].lstrip()[:9].lower() == b"<!doctype" for p in pages)
    pngs = [i for i in work.read("images").to_pylist() if i["mime"] == "image/png"]
    assert [i["image_url"] for i in pngs] == ["http://www.iana.org/_img/2013.1/iana-logo-homepage.png"]
    assert pngs[0]["bytes"].startswith(b"\x89PNG\r\n\x1a\n")
    import io

    from PIL import Image
    assert Image.open(io.BytesIO(pngs[0]["bytes"])).size[0] > 0


@pytest.mark.parametrize("name", ["example-bad.warc.gz.bad", "example.warc", "bad.arc", "missing-status-text.warc"])
def test_pywb_malformed_files_are_recorded(shared_data, tmp_path, name):
    (report,) = ingest_files([shared_data / "warc" / "pywb" / name], tmp_path / "W", show_progress=False)
    assert report.failed is None and report.damage
