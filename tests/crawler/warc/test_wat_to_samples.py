"""Issue 30: a WAT file alone gives samples, as LAION-5B was built from Common Crawl's WAT
metadata: each page's image links with their alt texts, no page fetched.

The shared capture's WAT holds only the request record, so the response record's WAT is
written from the shared WARC in Common Crawl's format (`tests/kit/wat.py`). Its image hosts are
pointed at a local HTTPS mirror with ``--resolve``; the mirror's log shows the images (and
robots.txt) requested, never the page; the samples' captions are the page's alt texts."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections import Counter
from urllib.parse import urlsplit

from kit.photos import PhotoServer, PhotoSite, ingest_with_https_mirror
from kit.pipeline_kit import run_to_samples
from kit.wat import write_wat
from lait.crawler.warc_links import wat_image_links
from lait.workdir import WorkDir

PAGE = "https://an.wikipedia.org/wiki/Escopete"
PIPELINE = ("filter: {unsafe_model: none}\n"  # stage 2's model gates: not what this test is about
            "clean: {languages: [any], min_words: 1}\n"  # Aragonese alt texts, some of one word
            "score: {model: demo, near_dup_threshold: 0.999}\nbuild: {samples_per_shard: 50, face_model: none}\n")


def lait(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lait", *argv], capture_output=True, text=True, timeout=timeout)


def test_wat_links_read_title_lang_and_opt_outs():
    doc = {"Envelope": {"WARC-Header-Metadata": {"WARC-Target-URI": "http://ex.test/a/page.html"},
                        "Payload-Metadata": {"HTTP-Response-Metadata": {
                            "Headers": {"Content-Type": "text/html"},
                            "HTML-Metadata": {
                                "Head": {"Title": " A  page ", "Metas": [
                                    {"name": "robots", "content": "noimageai"},
                                    {"name": "HTML@/lang", "content": "de"}]},
                                "Links": [{"path": "A@/href", "url": "/b.html", "text": "b"},
                                          {"path": "IMG@/src", "url": "p.jpg", "alt": "A red bus"}]}}}}}
    page = wat_image_links(json.dumps(doc).encode())
    assert (page.title, page.lang, page.robots_meta) == ("A page", "de", "noimageai")
    assert [(link.image_url, link.alt) for link in page.links] == [("http://ex.test/a/p.jpg", "A red bus")]


def test_wat_page_with_noai_meta_or_tdm_reservation_gives_no_links(tmp_path):
    from warcio.warcwriter import WARCWriter

    from lait.crawler.warc_ingest import ingest_file

    path = tmp_path / "x.warc.wat.gz"
    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=True)
        for url, metas in [("http://ex.test/ok.html", []),
                           ("http://ex.test/noai.html", [{"name": "robots", "content": "noai"}]),
                           ("http://ex.test/tdm.html", [{"name": "tdm-reservation", "content": "1"}])]:
            doc = {"Envelope": {"WARC-Header-Metadata": {"WARC-Target-URI": url},
                                "Payload-Metadata": {"HTTP-Response-Metadata": {
                                    "Headers": {}, "HTML-Metadata": {
                                        "Head": {"Metas": metas},
                                        "Links": [{"path": "IMG@/src", "url": url + ".jpg", "alt": "x"}]}}}}}
            w.write_record(w.create_warc_record(url, "metadata", payload=io.BytesIO(json.dumps(doc).encode()),
                                                warc_content_type="application/json"))
    work = WorkDir(tmp_path / "W", n_partitions=2).init()
    report = ingest_file(path, work.url)
    assert report.failed is None
    assert [r["page_url"] for r in work.read("warc_links").to_pylist()] == ["http://ex.test/ok.html"]
    reasons = {r["page_url"]: r["reason"] for r in work.read("rejected").to_pylist()}
    assert reasons == {"http://ex.test/noai.html": "ingest/noai_page",
                       "http://ex.test/tdm.html": "ingest/tdm_reserved_page"}


def test_wat_file_alone_gives_samples_of_its_alt_texts(shared_data, tmp_path):
    wat = write_wat(shared_data / "warc" / "commoncrawl" / "whirlwind.warc.gz", tmp_path / "page.warc.wat.gz")
    from lait.crawler.warc import WarcReader

    page = next(wat_image_links(r.block, r.url) for r in WarcReader(wat) if r.type == "metadata")
    image_urls = sorted({link.image_url for link in page.links})
    alts = {link.alt for link in page.links if link.alt}
    assert len(image_urls) >= 11 and len(alts) >= 5
    work = tmp_path / "W"
    site = ingest_with_https_mirror(wat, image_urls, shared_data / "photos" / "coco_train", work, lait)
    # The images were fetched, the page never: only image paths, robots.txt and tdmrep.json.
    page_path = urlsplit(PAGE).path
    assert page_path not in site.hits
    fetched = {h for h in site.hits if h not in ("/robots.txt", "/.well-known/tdmrep.json")}
    assert fetched == set(site.files)
    w = WorkDir(work)
    assert w.count("pages") == 0
    links = w.read("warc_links").to_pylist()
    assert {(r["source"], r["page_url"], r["page_title"], r["page_lang"]) for r in links} == {
        ("wat", PAGE, "Escopete - Biquipedia, a enciclopedia libre", "an")}

    samples = run_to_samples(work, PIPELINE, lait)
    print(f"{len(samples)} samples:", sorted(s["caption"] for s in samples))
    for s in samples:
        assert s["url"] in image_urls and s["page_url"] == PAGE
        assert s["caption"] in alts and s["source"] == "alt", s


def test_path_list_of_archive_urls(shared_data, tmp_path):
    """A Common Crawl path list (`wat.paths.gz`) read from a server as `--base-url`, its archive
    fetched over HTTP through fsspec; a second run skips the archive it already ingested (its URL,
    size and ETag unchanged)."""
    import gzip

    wat = write_wat(shared_data / "warc" / "commoncrawl" / "whirlwind.warc.gz", tmp_path / "page.warc.wat.gz")
    rel = "crawl-data/CC-MAIN-2024-22/segments/1/wat/page.warc.wat.gz"
    site = PhotoSite({f"/{rel}": wat.read_bytes(),
                      "/crawl-data/CC-MAIN-2024-22/wat.paths.gz": gzip.compress(f"{rel}\n".encode())})
    work = tmp_path / "W"
    with PhotoServer(site) as server:
        listing = f"{server.url}/crawl-data/CC-MAIN-2024-22/wat.paths.gz"
        runs = [lait("ingest-warc", listing, "--base-url", server.url + "/", "--out", str(work), "--partitions", "2",
                     "--no-fetch-images", "--log-level", "WARNING", "--no-progress") for _ in range(2)]
    for done in runs:
        assert done.returncode == 0, done.stderr[-3000:]
    assert "already ingested" not in runs[0].stderr and "already ingested" in runs[1].stderr
    links = WorkDir(work).read("warc_links").to_pylist()
    assert {(r["page_url"], r["warc_file"]) for r in links} == {(PAGE, "page.warc.wat.gz")}
    assert len({r["image_url"] for r in links}) == 13


def test_wat_beside_its_warc_adds_no_second_candidate(shared_data, tmp_path):
    """WARC and WAT of one crawl ingested together: the archived page gives each image its
    texts once; the WAT's links of the same page are left to it."""
    from lait.crawler.warc_ingest import ingest_file

    warc = shared_data / "warc" / "commoncrawl" / "whirlwind.warc.gz"
    wat = write_wat(warc, tmp_path / "page.warc.wat.gz")
    counts, placed = {}, set()
    for name, files in (("warc", [warc]), ("both", [warc, wat]), ("wat", [wat])):
        work = WorkDir(tmp_path / name, n_partitions=2).init()
        for f in files:
            assert ingest_file(f, work.url).failed is None
        done = lait("clean", str(work.root), "--languages", "any", "--min-words", "1", "--workers", "1",
                    "--no-progress")
        assert done.returncode == 0, done.stderr[-2000:]
        rows = work.read("candidates").to_pylist()
        pairs = Counter((r["page_url"], r["image_url"]) for r in rows)
        assert set(pairs.values()) == {1}, pairs
        counts[name] = {k: sorted((t["source"], t["text"]) for r in rows if (r["page_url"], r["image_url"]) == k
                                  for t in r["texts"]) for k in pairs}
        if name == "warc":  # texts the page gives, dropped for where their image sits (a logo's alt)
            placed = {("alt", r["text"]) for r in work.read("rejected").to_pylist()
                      if r["reason"] == "clean/image_place" and r["detail"].startswith("alt ")}
    assert len(counts["wat"]) == 7 and len(counts["warc"]) >= 7
    assert counts["both"] == counts["warc"]
    # The WAT alone: alt texts only, each of them one the page gives too. (The WAT has no markup
    # to say where an image sits: the page drops a logo's alt for its place, the WAT keeps it.)
    for key, texts in counts["wat"].items():
        assert {s for s, _ in texts} == {"alt"}
        assert set(texts) <= set(counts["warc"].get(key, [])) | {t for v in counts["warc"].values() for t in v} | placed


def test_archive_url_of_another_fsspec_filesystem(shared_data, tmp_path):
    """An archive URL of a non-HTTP fsspec filesystem (memory://, in this process) is read
    through `lait.storage` like s3:// would be, and is skipped once ingested."""
    import fsspec

    from lait.crawler.warc_ingest import ingest_files

    wat = write_wat(shared_data / "warc" / "commoncrawl" / "whirlwind.warc.gz", tmp_path / "page.warc.wat.gz")
    url = "memory://lait-test-archives/crawl/page.warc.wat.gz"
    with fsspec.open(url, "wb") as f:
        f.write(wat.read_bytes())
    try:
        work = WorkDir(tmp_path / "W", n_partitions=2)
        first = ingest_files([url], work.url, show_progress=False)
        again = ingest_files([url], work.url, show_progress=False)
    finally:
        fsspec.filesystem("memory").rm("/lait-test-archives", recursive=True)
    assert first[0].failed is None and first[0].links == 13 and not first[0].skipped
    assert again[0].skipped
    assert {r["warc_file"] for r in work.read("warc_links").to_pylist()} == {"page.warc.wat.gz"}
