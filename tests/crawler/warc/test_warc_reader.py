"""WarcReader on archives written here: clean, truncated, badly gzipped, not an archive."""

from __future__ import annotations

import gzip
import zlib

import pytest

from lait.crawler.warc import (
    HttpResponse,
    WarcReader,
    dechunk,
    decode_body,
    looks_like_archive,
    parse_http,
    scan_gzip_members,
)


def rules(reader: WarcReader) -> list[str]:
    return [d.rule for d in reader.damage]


@pytest.mark.parametrize("gz", [True, False])
def test_clean_archive_reads_every_record_without_damage(tmp_path, factory, gz):
    path = factory.write_site_warc(tmp_path / ("a.warc.gz" if gz else "a.warc"), n_pages=3, gzip=gz)
    reader = WarcReader(path)
    recs = list(reader)
    assert reader.damage == []
    assert reader.readers == ["fastwarc"]
    assert [r.index for r in recs] == list(range(len(recs)))
    urls = [r.url for r in recs if r.type == "response"]
    assert urls[:2] == ["http://ex.test/p0.html", "http://ex.test/img/b0.png"]
    first = next(r for r in recs if r.type == "response")
    assert parse_http(first.block).status == 200 and b"a red bus 0" in first.block
    assert all(r.block is None for r in recs if r.type == "request")


def test_truncated_plain_warc_keeps_records_before_the_cut(tmp_path, factory):
    full = factory.write_site_warc(tmp_path / "full.warc", n_pages=4, gzip=False)
    data = full.read_bytes()
    n_full = len(list(WarcReader(full)))
    cut = tmp_path / "cut.warc"
    cut.write_bytes(data[: data.index(b"Page 2 text.") + 5])  # inside the payload of page 2
    reader = WarcReader(cut)
    recs = list(reader)
    assert 0 < len(recs) < n_full
    assert "truncated_record" in rules(reader)
    damaged = [d for d in reader.damage if d.rule == "truncated_record"]
    assert damaged[0].record == len(recs) - 1  # the last one read is the cut one
    assert all(not r.truncated for r in recs[:-1])
    assert recs[-1].truncated and recs[-1].url == "http://ex.test/p2.html"


def test_truncated_gzip_warc_is_recorded(tmp_path, factory):
    full = factory.write_site_warc(tmp_path / "full.warc.gz", n_pages=4)
    data = full.read_bytes()
    cut = tmp_path / "cut.warc.gz"
    cut.write_bytes(data[: int(len(data) * 0.6)])
    reader = WarcReader(cut)
    recs = list(reader)
    assert recs and recs[0].url == "http://ex.test/p0.html" and not recs[0].truncated
    assert "truncated_gzip" in rules(reader)


def test_one_gzip_member_for_the_whole_file_is_recorded_but_read(tmp_path, factory):
    plain = factory.write_site_warc(tmp_path / "a.warc", n_pages=2, gzip=False)
    whole = tmp_path / "whole.warc.gz"
    whole.write_bytes(gzip.compress(plain.read_bytes()))
    good = list(WarcReader(plain))
    reader = WarcReader(whole)
    recs = list(reader)
    assert [r.url for r in recs] == [r.url for r in good]
    assert rules(reader) == ["gzip_members"]
    assert len(scan_gzip_members(whole)[0]) == 1


def test_text_file_is_not_an_archive(tmp_path):
    p = tmp_path / "notes.warc"
    p.write_text("just some notes\nWARC-Type: response\n" * 20)
    reader = WarcReader(p)
    assert list(reader) == []
    assert rules(reader) == ["not_warc"]
    assert not looks_like_archive(p)


def test_broken_header_midway_falls_back_to_warcio_without_duplicates(tmp_path, factory):
    full = factory.write_site_warc(tmp_path / "a.warc", n_pages=3, gzip=False)
    data = full.read_bytes()
    # Damage the Content-Length of the third record so that FastWARC gives up there.
    third = data.index(b"WARC/1.0", data.index(b"WARC/1.0", 1) + 1)
    cl = data.index(b"Content-Length: ", third)
    bad = data[:cl] + b"Content-Length: 5" + data[data.index(b"\r\n", cl):]
    p = tmp_path / "bad.warc"
    p.write_bytes(bad)
    reader = WarcReader(p)
    recs = list(reader)
    ids = [r.headers.get("WARC-Record-ID") for r in recs]
    assert len(ids) == len(set(ids))  # no record read twice
    assert recs[0].url == "http://ex.test/p0.html"
    assert reader.damage  # whatever the readers made of it, it is on record


def test_parse_http_and_decodings():
    block = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n"
             b"Content-Encoding: gzip\r\nX-Robots-Tag: a\r\nX-Robots-Tag: noai\r\n\r\n")
    payload = gzip.compress(b"<html>hello</html>")
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)
    resp = parse_http(block + chunked)
    assert resp.status == 200 and resp.header("x-robots-tag") == "a, noai"
    assert decode_body(resp) == (b"<html>hello</html>", None)
    # Body stored de-chunked although the header still says chunked: left as is.
    assert dechunk(b"<html>not chunked</html>") is None
    body, problem = decode_body(HttpResponse(200, [("Content-Encoding", "gzip")], b"not gzip"))
    assert body == b"not gzip" and problem.startswith("content_encoding: ")
    raw_deflate = zlib.compressobj(wbits=-15)
    data = raw_deflate.compress(b"abc") + raw_deflate.flush()
    assert decode_body(HttpResponse(200, [("Content-Encoding", "deflate")], data)) == (b"abc", None)
    with pytest.raises(ValueError):
        parse_http(b"HTTPX/1.1 200 OK\r\n\r\n")
    assert parse_http(b"HTTP/1.0 302\r\nLocation: /x\r\n\r\n").status == 302
