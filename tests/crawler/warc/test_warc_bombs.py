"""Issue 19: compression bombs in archives cost bounded memory, and the file's good records stay.

Each archive holds good pages and images before and after the bomb. The ingest runs in a
subprocess that reports its peak resident memory (`VmHWM` of /proc); it must stay under 512 MiB
where the unbounded decoder took gigabytes. Bombs are built in streaming fashion: a deflate
stream of zeros repeats the same bytes after each full flush, so a GiB-sized bomb is a few
megabytes of identical blocks (and the test process never holds what it expands to).
"""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import uuid
import zlib
from pathlib import Path

import pytest

MIB = 1 << 20
PEAK_LIMIT_MB = 512


def gzip_of_zeros(n_mib: int, fill: bytes = b"\0") -> bytes:
    """A valid gzip stream that expands to `n_mib` MiB of `fill`, made without compressing
    them all: after a full flush the compressor's output for the same input repeats."""
    block = fill * MIB
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    first = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    tail = c.flush()  # the trailer of a 2 MiB stream: recomputed below for n_mib
    crc = 0
    for _ in range(n_mib):
        crc = zlib.crc32(block, crc)
    body = tail[:-8] + crc.to_bytes(4, "little") + ((n_mib * MIB) & 0xFFFFFFFF).to_bytes(4, "little")
    return first + again * (n_mib - 1) + body


def warc_member(url: str, http_head: bytes, body: bytes | None = None, *, zero_body_mib: int = 0) -> bytes:
    """One gzip member holding one WARC response record. `zero_body_mib` appends that many MiB
    of b"a" to `body` as it compresses, so a 300 MiB page never sits in this process."""
    extra = zero_body_mib * MIB
    block_len = len(http_head) + len(body or b"") + extra
    head = (f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: {url}\r\n"
            f"WARC-Date: 2024-05-20T10:00:00Z\r\nWARC-Record-ID: <urn:uuid:{uuid.uuid4()}>\r\n"
            f"Content-Type: application/http; msgtype=response\r\nContent-Length: {block_len}\r\n\r\n").encode()
    c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [c.compress(head + http_head + (body or b""))]
    chunk = b"a" * MIB
    for _ in range(zero_body_mib):
        out.append(c.compress(chunk))
    out.append(c.compress(b"\r\n\r\n"))
    out.append(c.flush())
    return b"".join(out)


def http_head(content_type: str, *headers: str) -> bytes:
    lines = ["HTTP/1.1 200 OK", f"Content-Type: {content_type}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def good_records(tag: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 24), (10, 200, 30)).save(buf, "PNG")
    page = f"<html><body><p>good page {tag}</p><img src='/g{tag}.png' alt='green {tag}'></body></html>".encode()
    return (warc_member(f"http://good.test/{tag}.html", http_head("text/html; charset=utf-8"), page)
            + warc_member(f"http://good.test/g{tag}.png", http_head("image/png"), buf.getvalue()))


def ingest_peak(path: Path, work: Path, python: str) -> tuple[dict, int]:
    """Ingest `path` in a fresh process: (its file report, its peak RSS in MiB).

    The peak is the kernel's high-water mark of the process's own memory (VmHWM), which an
    exec starts afresh; `ru_maxrss` would also count the test process it was forked from."""
    code = (
        "import json, sys\n"
        "from lait.crawler.warc_ingest import ingest_file\n"
        "from lait.parts import WorkDir\n"
        "WorkDir(sys.argv[2], n_partitions=2).init()\n"
        "r = ingest_file(sys.argv[1], sys.argv[2])\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
        "print(json.dumps({'report': r.to_dict(), 'peak_mb': int(hwm) // 1024}))\n"
    )
    done = subprocess.run([python, "-c", code, str(path), str(work)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["report"], out["peak_mb"]


def kept_and_rejected(work: Path) -> tuple[list[str], list[str], list[dict]]:
    from lait.workdir import WorkDir

    w = WorkDir(work)
    pages = sorted(r["url"] for r in w.iter_rows("pages", columns=["url", "error"]) if r["error"] is None)
    images = sorted(r["image_url"] for r in w.iter_rows("images", columns=["image_url", "error"])
                    if r["error"] is None)
    return pages, images, w.read("rejected").to_pylist()


GOOD_PAGES = ["http://good.test/after.html", "http://good.test/before.html"]
GOOD_IMAGES = ["http://good.test/gafter.png", "http://good.test/gbefore.png"]


def ingest_among_good_records(tmp_path: Path, python: str, name: str, url: str, head: bytes, body: bytes,
                              **member: int) -> tuple[dict, dict, Path]:
    """The record of `url` between good records, ingested in a fresh process within bounded
    memory, the good pages and images kept: (the file report, the reject of `url`, the WARC)."""
    path = tmp_path / name
    path.write_bytes(good_records("before") + warc_member(url, head, body, **member) + good_records("after"))
    report, peak = ingest_peak(path, tmp_path / "W", python)
    assert peak < PEAK_LIMIT_MB, f"peak RSS {peak} MiB"
    pages, images, rejected = kept_and_rejected(tmp_path / "W")
    assert pages == GOOD_PAGES and images == GOOD_IMAGES
    (bomb,) = [r for r in rejected if r["page_url"] == url]
    return report, bomb, path


@pytest.mark.parametrize("codings", ["gzip", "gzip, gzip"])
def test_gzip_bomb_body_is_rejected_within_bounded_memory(tmp_path, python, codings):
    inner = gzip_of_zeros(2048)  # 2 GiB of zeros in about 2 MiB
    body = gzip.compress(inner) if codings == "gzip, gzip" else inner
    report, bomb, _ = ingest_among_good_records(tmp_path, python, "bomb.warc.gz", "http://bomb.test/page.html",
                                                http_head("text/html", f"Content-Encoding: {codings}"), body)
    assert report["failed"] is None and report["records"] == 5
    assert bomb["reason"] == "ingest/body_too_large" and "more than" in bomb["detail"]


def test_encoded_300mb_page_is_not_stored(tmp_path, python):
    # The small-file kind: 300 MiB of page text, gzip-encoded, inside a gzipped WARC record.
    body = gzip_of_zeros(300, fill=b"<p>x</p>")  # 8 bytes x 1 MiB x 300 = 2.3 GiB of "page"
    _, big, path = ingest_among_good_records(tmp_path, python, "page.warc.gz", "http://bomb.test/big.html",
                                             http_head("text/html", "Content-Encoding: gzip"), body)
    assert path.stat().st_size < 4 * MIB
    assert big["reason"] == "ingest/body_too_large"


def test_stored_300mb_page_record_is_skipped_unread(tmp_path, python):
    # The stored kind: the record itself holds a 300 MiB page (a 300 KB gzip member).
    _, big, path = ingest_among_good_records(tmp_path, python, "stored.warc.gz", "http://bomb.test/stored.html",
                                             http_head("text/html"), b"<html>", zero_body_mib=300)
    assert path.stat().st_size < 2 * MIB
    assert big["reason"] == "ingest/too_large"


def test_stored_page_over_the_page_limit_but_under_the_record_limit(tmp_path, python):
    # 40 MiB: read (under --max-record-mb 64), but larger than a page may be (10 MiB).
    _, mid, _ = ingest_among_good_records(tmp_path, python, "mid.warc.gz", "http://bomb.test/mid.html",
                                          http_head("text/html"), b"<html>", zero_body_mib=40)
    assert mid["reason"] == "ingest/body_too_large" and str(10 << 20) in mid["detail"]


def test_decoders_stop_at_the_limit():
    from lait.crawler.warc import BodyTooLarge, HttpResponse, decode_body, decode_coding

    bomb = gzip_of_zeros(64)
    with pytest.raises(BodyTooLarge):
        decode_coding(bomb, "gzip", limit=MIB)
    assert decode_coding(bomb, "gzip", limit=None) == b"\0" * (64 * MIB)  # the bomb is valid gzip
    assert decode_coding(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip", 10) == b"abcd"
    body, problem = decode_body(HttpResponse(200, [("Content-Encoding", "deflate")], zlib.compress(b"x" * 100)), 50)
    assert problem.startswith("body_too_large: ")
    assert decode_body(HttpResponse(200, [("Content-Encoding", "deflate")], zlib.compress(b"x" * 50)), 50) \
        == (b"x" * 50, None)
    import brotli

    body, problem = decode_body(HttpResponse(200, [("Content-Encoding", "br")], brotli.compress(b"\0" * (8 * MIB))), MIB)
    assert problem.startswith("body_too_large: ")
    body, problem = decode_body(HttpResponse(200, [("Content-Encoding", "gzip")], gzip.compress(b"abc")[:-6]), 100)
    assert problem.startswith("content_encoding: ")  # a cut stream is damaged, not too large


def test_zstd_decodes_within_the_limit():
    """zstd, which Scrapy decodes for the crawl, is decoded from archives too, as boundedly."""
    from lait.crawler.warc import BodyTooLarge, HttpResponse, decode_body, decode_coding

    zstd = pytest.importorskip("backports.zstd")
    c = zstd.ZstdCompressor()
    bomb = b"".join([c.compress(bytes(MIB)) for _ in range(64)] + [c.flush()])  # 64 MiB in 2 KB
    with pytest.raises(BodyTooLarge):
        decode_coding(bomb, "zstd", limit=MIB)
    assert decode_coding(zstd.compress(b"ab") + zstd.compress(b"cd"), "zstd", 10) == b"abcd"
    body, problem = decode_body(HttpResponse(200, [("Content-Encoding", "zstd")], bomb), MIB)
    assert problem.startswith("body_too_large: ")
    body, problem = decode_body(HttpResponse(200, [("Content-Encoding", "zstd")], zstd.compress(b"abc" * 99)[:-3]), 1000)
    assert problem.startswith("content_encoding: ")
