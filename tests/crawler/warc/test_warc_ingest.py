"""ingest_file / ingest_files on archives written here: tables, partitions, noai, reruns, damage."""

from __future__ import annotations

from collections import Counter

import pytest
from warcio.warcwriter import WARCWriter

from lait.crawler.warc_ingest import IngestOptions, file_tag, ingest_file, ingest_files, is_ingested
from lait.pagereader import is_noai, robots_directives
from lait.workdir import WorkDir, partition_of


def reasons(work: WorkDir) -> Counter:
    return Counter(r["reason"] for r in work.iter_rows("rejected", columns=["reason"]))


@pytest.fixture
def work(tmp_path):
    return WorkDir(tmp_path / "work", n_partitions=4).init()


def test_pages_images_and_links_land_in_their_partitions(tmp_path, factory, work):
    path = factory.write_site_warc(tmp_path / "site.warc.gz", n_pages=4)
    report = ingest_file(path, work.root)
    assert report.failed is None and report.damage == []
    assert (report.pages, report.images) == (6, 5)  # 4 pages + the 404 + the noai page; 4 PNGs + the noai one
    for table, key in [("pages", "url"), ("images", "image_url"), ("warc_links", "image_url")]:
        for p in work.partitions(table):
            for row in work.iter_rows(table, p, columns=[key]):
                assert partition_of(row[key], work.n_partitions) == p
    pages = {r["url"]: r for r in work.read("pages").to_pylist()}
    assert b"a red bus 2" in pages["http://ex.test/p2.html"]["html"]
    assert pages["http://ex.test/p2.html"]["encoding"] == "utf-8"
    assert pages["http://ex.test/p2.html"]["headers"]  # the captured HTTP headers
    missing = pages["http://ex.test/missing.html"]
    assert missing["status"] == 404 and missing["html"] is None and missing["error"] == "http_404"
    images = {r["image_url"]: r for r in work.read("images").to_pylist()}
    assert images["http://ex.test/img/b1.png"]["bytes"] == factory.png_bytes(41, 30)
    assert images["http://ex.test/img/b1.png"]["mime"] == "image/png"
    links = {(r["page_url"], r["image_url"]): r for r in work.read("warc_links").to_pylist()}
    a = links[("http://ex.test/p1.html", "http://ex.test/img/a1.jpg")]
    assert (a["alt"], a["source"], a["warc_file"]) == ("a red bus 1", "html", "site.warc.gz")
    assert links[("http://ex.test/p1.html", "http://ex.test/img/b1.png")]["title"] == "title 1"  # data-src
    assert ("http://ex.test/p1.html", "http://ex.test/og1.jpg") in links
    assert not any(u.startswith("data:") for _, u in links)
    assert len([k for k in links if k[0] == "http://ex.test/p1.html"]) == 3


def test_noai_pages_and_images_are_recorded_not_stored(tmp_path, factory, work):
    """As the crawl records them: a row with error noai, status and headers, no body."""
    report = ingest_file(factory.write_site_warc(tmp_path / "site.warc.gz", n_pages=1), work.root)
    pages = {r["url"]: r for r in work.read("pages").to_pylist()}
    private = pages["http://ex.test/private.html"]
    assert (private["status"], private["error"], private["html"], private["encoding"]) == (200, "noai", None, None)
    assert dict(private["headers"])["x-robots-tag"] == "noai"
    images = {r["image_url"]: r for r in work.read("images").to_pylist()}
    secret = images["http://ex.test/img/secret.png"]
    assert (secret["status"], secret["error"], secret["bytes"]) == (200, "noai", None)
    assert work.count("rejected") == 0
    assert report.counters["ingest/page_noai"] == 1 and report.counters["ingest/image_noai"] == 1
    # Links of a noai page are not kept either.
    assert all(r["page_url"] != "http://ex.test/private.html" for r in work.read("warc_links").to_pylist())


@pytest.mark.parametrize("value,expected", [("noai", True), ("noindex, NoImageAI", True),
                                            ("otherbot: noai", True), ("noindex", False), (None, False),
                                            ("noairline", False), ("noindex; noai", True)])
def test_noai_in_an_x_robots_tag_value(value, expected):
    assert is_noai(robots_directives(value)) is expected


def test_a_page_with_a_noai_robots_meta_tag_is_recorded_not_stored(tmp_path, factory, work):
    path = tmp_path / "meta.warc.gz"
    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=True)
        factory.response(w, "http://ex.test/meta-noai.html", b'<html><head><meta name="robots" '
                         b'content="index, NoImageAI"></head><body><img src="/x.jpg"></body></html>', "text/html")
        factory.response(w, "http://ex.test/open.html", b'<html><body><img src="/y.jpg"></body></html>', "text/html")
    ingest_file(path, work.root)
    pages = work.read("pages").to_pylist()
    assert sorted((r["url"], r["error"], r["html"] is None) for r in pages) == [
        ("http://ex.test/meta-noai.html", "noai", True), ("http://ex.test/open.html", None, False)]
    assert [r["image_url"] for r in work.read("warc_links").to_pylist()] == ["http://ex.test/y.jpg"]
    assert work.count("rejected") == 0


def test_wat_links_with_alt_text(tmp_path, factory, work):
    path = tmp_path / "x.warc.wat.gz"
    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=True)
        factory.wat_record(w, "https://ex.test/a/page.html", [
            {"path": "IMG@/src", "url": "../pics/cat.jpg", "alt": "  a  sleeping cat "},
            {"path": "A@/href", "url": "/other.html", "text": "next"},
            {"path": "IMG@/src", "url": "data:image/png;base64,xx", "alt": "inline"},
        ])
        factory.wat_record(w, "https://ex.test/secret.html", [{"path": "IMG@/src", "url": "/s.jpg", "alt": "s"}],
                           robots="noai")
    report = ingest_file(path, work.root)
    rows = work.read("warc_links").to_pylist()
    assert [(r["page_url"], r["image_url"], r["alt"], r["source"]) for r in rows] == [
        ("https://ex.test/a/page.html", "https://ex.test/pics/cat.jpg", "a sleeping cat", "wat")]
    assert report.links == 1 and reasons(work)["ingest/noai_page"] == 1


def test_rerun_skips_finished_files_and_force_replaces_their_parts(tmp_path, factory, work):
    path = factory.write_site_warc(tmp_path / "site.warc.gz", n_pages=3)
    first = ingest_file(path, work.root)
    assert is_ingested(work, path)
    counts = {t: work.count(t) for t in ("pages", "images", "warc_links", "rejected")}
    assert ingest_file(path, work.root).skipped
    again = ingest_file(path, work.root, IngestOptions(force=True))
    assert not again.skipped and again.pages == first.pages
    assert {t: work.count(t) for t in counts} == counts  # replaced, not appended
    # A changed file is redone even without --force.
    factory.write_site_warc(path, n_pages=5)
    assert not is_ingested(work, path)
    assert ingest_file(path, work.root).pages == 7  # 5 pages + the 404 + the noai page
    assert work.count("pages") == 7
    tags = {p.name.split("-", 1)[1].rsplit(".parquet")[0] for p in work.part_files("pages")}
    assert tags == {file_tag(path)}


def test_truncated_file_keeps_earlier_records_and_records_the_damage(tmp_path, factory, work):
    full = factory.write_site_warc(tmp_path / "full.warc", n_pages=4, gzip=False)
    data = full.read_bytes()
    cut = tmp_path / "cut.warc"
    cut.write_bytes(data[: data.index(b"Page 2 text.") + 5])
    report = ingest_file(cut, work.root)
    assert report.failed is None
    assert report.pages == 2 and report.images == 2  # p0, b0, p1, b1; p2 is cut
    assert any(d.startswith("truncated_record") for d in report.damage)
    rej = [r for r in work.read("rejected").to_pylist() if r["reason"] == "ingest/truncated_record"]
    assert rej and rej[0]["page_url"] == "http://ex.test/p2.html"
    assert "http://ex.test/p2.html" not in {r["url"] for r in work.read("pages", columns=["url"]).to_pylist()}


def test_parallel_ingest_equals_serial(tmp_path, factory):
    paths = [factory.write_site_warc(tmp_path / f"s{i}.warc.gz", n_pages=2 + i) for i in range(3)]
    bad = tmp_path / "junk.warc.gz"
    bad.write_bytes(b"\x1f\x8b not really gzip")
    serial = ingest_files([*paths, bad], tmp_path / "w1", workers=1, show_progress=False)
    parallel = ingest_files([*paths, bad], tmp_path / "w2", workers=2, show_progress=False)
    assert [r.path for r in serial] == [r.path for r in parallel]
    assert [(r.pages, r.images, r.links, r.rejected) for r in serial] == \
           [(r.pages, r.images, r.links, r.rejected) for r in parallel]
    assert serial[-1].damage and serial[-1].damage[0].startswith("not_warc")
    assert not any(r.failed for r in parallel)
    w1, w2 = WorkDir(tmp_path / "w1"), WorkDir(tmp_path / "w2")
    for t in ("pages", "images", "warc_links", "rejected"):
        assert sorted(map(str, w1.read(t).to_pylist())) == sorted(map(str, w2.read(t).to_pylist()))
