"""Issue 19: the shared Common Crawl capture all the way to shards.

Common Crawl stores the page, not its images. `lait ingest-warc` records the images the page
references and fetches them with the crawler's fetcher; here the archived image hosts
(an.wikipedia.org, upload.wikimedia.org, ...) are pointed at a local HTTPS mirror on port 443
of a loopback address with ``--resolve``, which serves a real photo at each referenced path.
`lait run` then writes shards holding the page's images with texts of the page.
"""

from __future__ import annotations

import subprocess
import sys
from urllib.parse import urlsplit

from lxml import html as lxml_html
from warcio.archiveiterator import ArchiveIterator

from kit.photos import ingest_with_https_mirror
from kit.pipeline_kit import run_to_samples
from lait.workdir import WorkDir

PAGE = "https://an.wikipedia.org/wiki/Escopete"
PIPELINE = ("filter: {unsafe_model: none}\n"  # stage 2's model gates: not what this test is about
            "clean: {languages: [any]}\n"  # the page is in Aragonese
            "score: {model: demo, near_dup_threshold: 0.999}\nbuild: {samples_per_shard: 50, face_model: none}\n")


def lait(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lait", *argv], capture_output=True, text=True, timeout=timeout)


def archived_page(warc) -> bytes:
    """The page's HTML, read with warcio (not lait's reader)."""
    with open(warc, "rb") as f:
        for record in ArchiveIterator(f):
            if record.rec_type == "response" and record.rec_headers.get_header("WARC-Target-URI") == PAGE:
                return record.content_stream().read()
    raise AssertionError("the capture holds no response for the page")


def test_common_crawl_page_images_reach_the_shards(shared_data, tmp_path):
    from lait.crawler.warc_links import html_image_links

    warc = shared_data / "warc" / "commoncrawl" / "whirlwind.warc.gz"
    html = archived_page(warc)
    image_urls = sorted({link.image_url for link in html_image_links(html, PAGE)})
    hosts = sorted({urlsplit(u).hostname for u in image_urls})
    assert "upload.wikimedia.org" in hosts and len(image_urls) >= 11
    work = tmp_path / "W"
    site = ingest_with_https_mirror(warc, image_urls, shared_data / "photos" / "coco_train", work, lait)
    images = {r["image_url"]: r for r in WorkDir(work).iter_rows("images")}
    assert set(images) == set(image_urls)  # every reference fetched once, through the mirror
    assert all(r["status"] == 200 and r["error"] is None and r["page_url"] == PAGE for r in images.values())
    assert any(h.endswith("/robots.txt") for h in site.hits)  # the fetcher's rules: robots.txt per host

    samples = run_to_samples(work, PIPELINE, lait)
    tree = lxml_html.fromstring(html)
    page_text = " ".join(" ".join(tree.text_content().split()).split())
    alts = {" ".join((el.get("alt") or "").split()) for el in tree.iter("img")}
    for s in samples:
        assert s["url"] in image_urls and s["page_url"] == PAGE
        assert s["caption"] in alts or s["caption"] in page_text, s["caption"]
    assert {s["source"] for s in samples} <= {"alt", "title", "figcaption", "og", "aria", "context"}
