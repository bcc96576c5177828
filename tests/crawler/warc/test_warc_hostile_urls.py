"""Archives whose records or pages name `javascript:`, `data:`, `vbscript:` or `file:` URLs: each
record is rejected at intake (`ingest/bad_url`), no such URL reaches pages/, images/, warc_links/
or a URL column of rejected/."""

from __future__ import annotations

from collections import Counter

from warcio.warcwriter import WARCWriter

from lait.crawler.warc_ingest import ingest_file
from lait.urls import is_http_url
from lait.workdir import WorkDir

URL_COLUMNS = {"pages": ["url"], "images": ["image_url"], "warc_links": ["page_url", "image_url"],
               "rejected": ["page_url", "image_url"]}


def test_records_with_other_schemes_are_rejected_at_intake(tmp_path, factory):
    path = tmp_path / "hostile.warc.gz"
    page = (b'<html><head><meta property="og:image" content="JaVaScRiPt:alert(1)"></head><body>'
            b'<img src="vbscript:msgbox(1)" alt="v"><img src="data:image/png;base64,AAAA" alt="d">'
            b'<img src="/ok.jpg" alt="a good photo"></body></html>')
    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=True)
        factory.response(w, "JaVaScRiPt:alert(document.title='x')", page, "text/html")
        factory.response(w, "vbscript:msgbox(1)", factory.png_bytes(), "image/png")
        factory.response(w, "file:///etc/passwd", page, "text/html")
        factory.response(w, "http://ex.test/good.html", page, "text/html")
        factory.wat_record(w, "data:text/html,<script>alert(1)</script>", [{"path": "IMG@/src", "url": "/w.jpg"}])
        factory.wat_record(w, "http://ex.test/wat.html", [{"path": "IMG@/src", "url": "javascript:alert(2)"},
                                                          {"path": "IMG@/src", "url": "/fine.jpg", "alt": "fine"}])
    work = WorkDir(tmp_path / "work", n_partitions=2).init()
    report = ingest_file(path, work.root)
    assert report.failed is None
    reasons = Counter(r["reason"] for r in work.iter_rows("rejected"))
    assert reasons == {"ingest/bad_url": 4}
    for table, columns in URL_COLUMNS.items():
        for row in work.iter_rows(table, columns=columns):
            assert all(v is None or is_http_url(v) for v in row.values()), (table, row)
    assert [r["url"] for r in work.iter_rows("pages")] == ["http://ex.test/good.html"]
    assert work.count("images") == 0
    assert sorted(r["image_url"] for r in work.iter_rows("warc_links")) == [
        "http://ex.test/fine.jpg", "http://ex.test/ok.jpg"]
    details = " ".join(r["detail"] for r in work.iter_rows("rejected"))
    assert "'vbscript:msgbox(1)'" in details and "'file:///etc/passwd'" in details
