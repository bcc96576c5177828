"""A licence declared for an image (on its figure, in its own file) is kept apart from its page's
licence (issue 33): stage 3's `image_license`, stage 2's `rights`."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from lait.executor import LocalExecutor
from lait.filters.config import CleanConfig, FilterConfig
from lait.filters.image_rights import file_rights
from lait.filters.image_stage import ImageFilterStage
from lait.filters.text_stage import CleanStage

PAGE_CC = "https://creativecommons.org/licenses/by/4.0/"
FIGURE_CC = "https://creativecommons.org/licenses/by-sa/2.0/"
PAGE = f"""<!DOCTYPE html><html lang="en"><head><link rel="license" href="{PAGE_CC}"></head><body><article>
<figure><img src="/own.jpg" alt="A heron standing in the shallow water of a lake">
<figcaption>A heron at dawn. <a rel="license" href="{FIGURE_CC}">CC BY-SA 2.0</a></figcaption></figure>
<figure><img src="/agency.jpg" alt="Firefighters work at the scene of the warehouse fire">
<figcaption>Firefighters at the warehouse.</figcaption></figure>
</article><footer>Text licensed <a href="{PAGE_CC}">CC BY 4.0</a></footer></body></html>"""


def test_a_figures_licence_is_its_images_and_the_pages_stays_the_pages(make_work, td):
    work = make_work()
    td.write_table(work, "pages", [{**td.page_row("http://blog.test/post.html", PAGE), "license": PAGE_CC}], "url")
    cfg = CleanConfig(work=str(work.root), progress=False)
    assert LocalExecutor(workers=1, show_progress=False).run(CleanStage(cfg), work).ok
    rows = {r["image_url"]: r for r in work.iter_rows("candidates")}
    own, agency = rows["http://blog.test/own.jpg"], rows["http://blog.test/agency.jpg"]
    assert (own["license"], own["image_license"]) == (PAGE_CC, FIGURE_CC)
    # The photo from elsewhere is not given the page's licence as its own.
    assert (agency["license"], agency["image_license"]) == (PAGE_CC, None)


def xmp_packet(body: str) -> bytes:
    return ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
            '<rdf:Description rdf:about="" xmlns:dc="http://purl.org/dc/elements/1.1/" '
            'xmlns:xmpRights="http://ns.adobe.com/xap/1.0/rights/" xmlns:cc="http://creativecommons.org/ns#"'
            f'>{body}</rdf:Description></rdf:RDF></x:xmpmeta>').encode()


def with_iptc_copyright(jpeg: bytes, notice: bytes) -> bytes:
    """The JPEG with an APP13 segment holding an IPTC IIM Copyright Notice (2:116), as
    Photoshop writes it."""
    iim = b"\x1c\x02\x74" + len(notice).to_bytes(2, "big") + notice
    resource = b"8BIM\x04\x04\x00\x00" + len(iim).to_bytes(4, "big") + iim + b"\x00" * (len(iim) % 2)
    payload = b"Photoshop 3.0\x00" + resource
    return jpeg[:2] + b"\xff\xed" + (len(payload) + 2).to_bytes(2, "big") + payload + jpeg[2:]


def jpeg(xmp: bytes | None = None) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (32, 24), (90, 120, 30)).save(buf, "JPEG", **({"xmp": xmp} if xmp else {}))
    return buf.getvalue()


@pytest.mark.parametrize("data, rights", [
    (jpeg(xmp_packet(f'<cc:license rdf:resource="{FIGURE_CC}"/><dc:rights><rdf:Alt>'
                     '<rdf:li xml:lang="x-default">(c) Jane Doe</rdf:li></rdf:Alt></dc:rights>')), FIGURE_CC),
    (jpeg(xmp_packet('<dc:rights><rdf:Alt><rdf:li xml:lang="x-default">(c) 2021 Jane Doe, all rights reserved'
                     '</rdf:li></rdf:Alt></dc:rights>')), "(c) 2021 Jane Doe, all rights reserved"),
    (jpeg(xmp_packet('<xmpRights:WebStatement>https://photos.test/rights</xmpRights:WebStatement>')),
     "https://photos.test/rights"),
    (with_iptc_copyright(jpeg(), "© Max Müller".encode()), "© Max Müller"),
    (jpeg(), None),
])
def test_the_rights_an_image_file_declares(data, rights):
    with Image.open(io.BytesIO(data)) as im:
        assert file_rights(im, data, im.format) == rights


def test_stage_2_keeps_the_files_rights(make_work, td):
    work = make_work()
    big = td.encode(td.photo(3), "JPEG", xmp=xmp_packet(f'<cc:license rdf:resource="{FIGURE_CC}"/>'))
    plain = td.encode(td.photo(4))
    td.write_table(work, "images", [td.image_row("http://photos.test/cc.jpg", big),
                                    td.image_row("http://photos.test/plain.jpg", plain)], "image_url")
    cfg = FilterConfig(work=str(work.root), workers=1, progress=False)
    cfg.validate()
    assert LocalExecutor(workers=1, retries=0, show_progress=False).run(ImageFilterStage(cfg), work).ok
    rights = {r["image_url"]: r["rights"] for r in work.iter_rows("images_ok")}
    assert rights == {"http://photos.test/cc.jpg": FIGURE_CC, "http://photos.test/plain.jpg": None}
