"""Streaming WARC/ARC reading that survives damaged archives.

`WarcReader(path)` yields `WarcRecord`s (WARC headers plus the raw record block) and collects
`Damage` notes on the way: a record shorter than its Content-Length, a record with broken
headers, a gzip stream that is truncated or whose members do not match the records, a reader
that gave up half way. Nothing here raises on bad archive content: every record that can be
read is yielded, and what went wrong is in `reader.damage` once iteration ends.

FastWARC (C++, several times faster) reads first; when it fails on a file (ARC files, or
malformed records it cannot get past), warcio takes over from the record where FastWARC
stopped, so the records before the damage are read once and only once.

`parse_http` and `decode_body` split a response block into status, headers and payload and
undo transfer and content encodings, identically for both readers.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

# Record types whose blocks the ingest needs; the others are counted and skipped unread.
READ_TYPES = frozenset({"response", "resource", "metadata"})
GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class Damage:
    """Something wrong with an archive; `rule` becomes `ingest/RULE` in `rejected/`."""

    rule: str
    detail: str
    record: int | None = None  # index of the record it concerns (0-based), if any
    url: str | None = None


@dataclass
class WarcRecord:
    """One archive record: its WARC headers and, for the types read, its raw block."""

    index: int
    offset: int  # byte offset of the record in the file (compressed offset for .gz)
    type: str  # response, resource, revisit, metadata, request, warcinfo, conversion, ...
    url: str | None
    date: str | None
    content_type: str | None  # the WARC Content-Type (application/http; msgtype=response, ...)
    declared_length: int | None
    block: bytes | None = None  # None when not read (a type the ingest ignores, or too large)
    truncated: bool = False
    too_large: bool = False
    headers: dict[str, str] = field(default_factory=dict)


def _parse_length(value: object) -> int | None:
    try:
        n = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return n if n >= 0 else None


class WarcReader:
    """Iterate over the records of a WARC (or ARC) file, gzipped or not, noting damage.

    `max_record_bytes`: blocks declared larger are skipped unread (`too_large`), so one huge
    video cannot exhaust a worker's memory. `check_gzip`: after reading, compare the gzip
    members with the record offsets (one member per record is what the WARC spec asks for
    and what random access by offset relies on).
    """

    def __init__(self, path: str | Path, *, read_types: frozenset[str] = READ_TYPES,
                 max_record_bytes: int = 64 << 20, check_gzip: bool = True):
        self.path = Path(path)
        self.read_types = read_types
        self.max_record_bytes = max_record_bytes
        self.check_gzip = check_gzip
        self.damage: list[Damage] = []
        self.readers: list[str] = []
        self.records = 0
        self._offsets: list[int] = []
        self._bad_uris = 0

    def __iter__(self) -> Iterator[WarcRecord]:
        fast_error: Exception | None = None
        try:
            for rec in self._fastwarc():
                yield self._checked(rec)
        except Exception as exc:  # FastWARC signals any parse problem as OSError/ValueError
            fast_error = exc
        if fast_error is not None:
            if self.records == 0 and not looks_like_archive(self.path):
                self.damage.append(Damage("not_warc", f"not a WARC or ARC file ({_one_line(fast_error)})"))
            else:
                yield from self._warcio_from(self.records, fast_error)
        if self.check_gzip:
            self._check_gzip_members()

    # -- readers ---------------------------------------------------------------------------
    def _fastwarc(self) -> Iterator[WarcRecord]:
        from fastwarc.warc import ArchiveIterator, WarcRecordType

        if "fastwarc" not in self.readers:
            self.readers.append("fastwarc")
        with open(self.path, "rb") as f:
            for r in ArchiveIterator(f, record_types=WarcRecordType.any_type, parse_http=False):
                h = r.headers
                rtype = (h.get("WARC-Type") or "").lower() or "unknown"
                declared = _parse_length(h.get("Content-Length"))
                rec = WarcRecord(
                    index=self.records, offset=r.stream_pos, type=rtype,
                    url=h.get("WARC-Target-URI"), date=h.get("WARC-Date"),
                    content_type=h.get("Content-Type"), declared_length=declared,
                    headers=dict(h.items()),
                )
                self._read_block(rec, r.reader.read)
                yield rec

    def _warcio_from(self, start: int, cause: Exception) -> Iterator[WarcRecord]:
        """Read with warcio, skipping the `start` records FastWARC already yielded."""
        from warcio.archiveiterator import ArchiveIterator

        self.readers.append("warcio")
        n = 0
        error: Exception | None = None
        warnings = io.StringIO()
        try:
            with open(self.path, "rb") as f:
                it = ArchiveIterator(f, arc2warc=True, no_record_parse=True)
                while True:
                    # warcio prints what it tolerates ("Content-Length is invalid") to stderr:
                    # keep it as a damage note instead.
                    with contextlib.redirect_stderr(warnings):
                        r = next(it, None)
                        if r is not None and n < start:
                            r.raw_stream.read()
                    if r is None:
                        break
                    if n < start:
                        n += 1
                        continue
                    h = r.rec_headers
                    rtype = (r.rec_type or h.get_header("WARC-Type") or "unknown").lower()
                    rec = WarcRecord(
                        index=self.records, offset=-1, type=rtype,
                        url=h.get_header("WARC-Target-URI"), date=h.get_header("WARC-Date"),
                        content_type=h.get_header("Content-Type"),
                        declared_length=_parse_length(h.get_header("Content-Length")),
                        headers=dict(h.headers),
                    )
                    with contextlib.redirect_stderr(warnings):
                        self._read_block(rec, r.raw_stream.read)
                        # Only after the block is read: warcio reads to the record's end to answer.
                        rec.offset = self._offsets[-1] = it.get_record_offset()
                    n += 1
                    yield self._checked(rec)
        except Exception as exc:  # warcio raises ArchiveLoadFailed, ValueError, EOFError, zlib.error
            error = exc
        notes = [line.strip() for line in warnings.getvalue().splitlines() if "WARNING" in line]
        if notes:
            text = " ".join(warnings.getvalue().split())
            self.damage.append(Damage("reader_warning", f"warcio, {len(notes)} warning(s): {text[:300]}"))
        if n == 0 and self.records == 0:
            # Neither reader found a single record: not an archive (or broken from byte 0).
            self.damage.append(Damage("not_warc", f"no readable record: fastwarc: {cause}; warcio: {error}"))
        elif error is not None:
            self.damage.append(Damage("read_error", f"stopped after {self.records} records: {_one_line(error)}",
                                      record=self.records))
        elif start > 0:
            # FastWARC choked on something warcio tolerates (a wrong Content-Length, usually).
            self.damage.append(Damage("read_error", f"fastwarc stopped after {start} records "
                                      f"({_one_line(cause)}); warcio read the rest", record=start))

    def _read_block(self, rec: WarcRecord, read) -> None:
        self._offsets.append(rec.offset)
        if rec.type not in self.read_types:
            return
        if rec.declared_length is not None and rec.declared_length > self.max_record_bytes:
            rec.too_large = True
            return
        rec.block = read()
        if rec.declared_length is not None and len(rec.block) < rec.declared_length:
            rec.truncated = True

    def _checked(self, rec: WarcRecord) -> WarcRecord:
        self.records += 1
        if rec.url and (rec.url[:1] == "<" or " " in rec.url.strip()):
            # wget 1.14 wrote `<http://...>` (an erratum of WARC 1.0); some tools leave spaces.
            if not self._bad_uris:
                self.damage.append(Damage("bad_target_uri", f"WARC-Target-URI {rec.url[:200]!r} repaired "
                                          "(angle brackets or spaces); later ones repaired silently",
                                          record=rec.index, url=None))
            self._bad_uris += 1
            rec.url = rec.url.strip().removeprefix("<").removesuffix(">").strip().replace(" ", "%20")
        if rec.declared_length is None or rec.type == "unknown":
            self.damage.append(Damage("malformed_record", "missing or invalid WARC-Type/Content-Length",
                                      record=rec.index, url=rec.url))
        elif rec.truncated:
            got = len(rec.block or b"")
            self.damage.append(Damage("truncated_record", f"{got} of {rec.declared_length} bytes",
                                      record=rec.index, url=rec.url))
        return rec

    # -- gzip framing ----------------------------------------------------------------------
    def _check_gzip_members(self) -> None:
        with open(self.path, "rb") as f:
            if f.read(2) != GZIP_MAGIC:
                return
        starts, error = scan_gzip_members(self.path)
        if error:
            self.damage.append(Damage("truncated_gzip" if "truncated" in error else "bad_gzip", error))
        offsets = set(self._offsets)
        if offsets and not error and offsets != set(starts):
            self.damage.append(Damage(
                "gzip_members", f"{len(starts)} gzip members for {len(self._offsets)} records: "
                "not one member per record (records were still read)"))


def scan_gzip_members(path: str | Path, chunk: int = 1 << 20) -> tuple[list[int], str | None]:
    """Byte offsets where the gzip members of a file start, and an error if the stream is bad.

    Decompresses once and discards the output; C zlib speed, so cheap next to parsing.
    """
    starts: list[int] = []
    pos = 0  # file offset of the start of `buf`
    buf = b""
    d = None
    with open(path, "rb") as f:
        eof = False
        while True:
            if not buf and not eof:
                buf = f.read(chunk)
                eof = len(buf) < chunk
            if not buf:
                break
            if d is None:
                if len(buf) < 2 and not eof:
                    buf += f.read(chunk)
                    eof = len(buf) < chunk
                if buf[:2] != GZIP_MAGIC:
                    if not buf.strip(b"\x00\r\n "):
                        break  # padding after the last member is harmless
                    return starts, f"garbage after gzip member at offset {pos}"
                starts.append(pos)
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                _discard_output(d, buf)
            except zlib.error as exc:
                return starts, f"corrupt gzip member at offset {starts[-1]}: {exc}"
            if d.eof:
                used = len(buf) - len(d.unused_data)
                pos += used
                buf = d.unused_data
                d = None
            else:
                pos += len(buf)
                buf = b""
        if d is not None:
            return starts, f"truncated gzip member at offset {starts[-1]}"
    return starts, None


def _discard_output(d, data: bytes, out_chunk: int = 1 << 20) -> None:
    """Feed `data` to the decompressor `d`, throwing the output away `out_chunk` bytes at a
    time: a gzip bomb member (1 MiB in, 1 GiB out) costs no more memory than a chunk."""
    while True:
        d.decompress(data, out_chunk)
        data = d.unconsumed_tail
        if d.eof or not data:
            return


_ARC_LINE_RE = re.compile(rb"^(?:filedesc|https?|ftp|dns)://\S+ \S+ \d{12,}")


def looks_like_archive(path: str | Path) -> bool:
    """Whether a file starts like a WARC or ARC (after gunzip): lets a text file be refused."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if head[:2] == GZIP_MAGIC:
        try:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 4096)
        except zlib.error:
            return False
    head = head.lstrip()
    return head.startswith(b"WARC/") or bool(_ARC_LINE_RE.match(head))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


# -- HTTP ------------------------------------------------------------------------------------
_STATUS_RE = re.compile(rb"^HTTP/\d(?:\.\d)?\s+(\d{3})(?:\s+(.*))?$")
_CHUNK_SIZE_RE = re.compile(rb"[0-9A-Fa-f]+(?:;[^\r\n]*)?\r?\n")


class HttpError(ValueError):
    """A response block whose HTTP status line or headers cannot be parsed."""


@dataclass
class HttpResponse:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """All values of a header joined with ', ' (case-insensitive name), or None."""
        name = name.lower()
        values = [v for k, v in self.headers if k.lower() == name]
        return ", ".join(values) if values else None


def parse_http(block: bytes) -> HttpResponse:
    """Split an `application/http; msgtype=response` block into status, headers, body."""
    end = block.find(b"\r\n\r\n")
    sep = 4
    if end < 0 or (0 <= block.find(b"\n\n") < end):
        alt = block.find(b"\n\n")
        if alt >= 0:
            end, sep = alt, 2
    if end < 0:
        end, sep = len(block), 0
    head = block[:end].split(b"\n")
    m = _STATUS_RE.match(head[0].rstrip(b"\r"))
    if not m:
        raise HttpError(f"bad HTTP status line {head[0][:80]!r}")
    headers: list[tuple[str, str]] = []
    for line in head[1:]:
        line = line.rstrip(b"\r")
        if not line:
            continue
        if line[:1] in (b" ", b"\t") and headers:  # obsolete line folding
            k, v = headers[-1]
            headers[-1] = (k, v + " " + line.strip().decode("latin-1"))
            continue
        k, colon, v = line.partition(b":")
        if colon:
            headers.append((k.strip().decode("latin-1"), v.strip().decode("latin-1")))
    return HttpResponse(int(m.group(1)), headers, block[end + sep:])


def dechunk(body: bytes) -> bytes | None:
    """Undo HTTP chunked transfer encoding; None when the body is not actually chunked.

    Many archives keep `Transfer-Encoding: chunked` in the headers but store the body
    already de-chunked, so a body that does not start like a chunk is left as it is.
    """
    if not _CHUNK_SIZE_RE.match(body[:64]):
        return None
    out = []
    pos = 0
    while pos < len(body):
        m = _CHUNK_SIZE_RE.match(body, pos)
        if not m:
            return None
        size = int(m.group(0).split(b";")[0].strip(), 16)
        pos = m.end()
        if size == 0:
            return b"".join(out)
        if pos + size > len(body):
            return None
        out.append(body[pos:pos + size])
        pos += size
        if body[pos:pos + 2] == b"\r\n":
            pos += 2
        elif body[pos:pos + 1] == b"\n":
            pos += 1
    return None  # no terminating zero-size chunk: not chunked after all, or cut short


class BodyTooLarge(ValueError):
    """A payload that decodes to more bytes than allowed (a compression bomb, or just too big)."""


DECODE_CHUNK = 1 << 20  # bytes of output a decoder makes per step


def _inflate(data: bytes, wbits: int, limit: int | None) -> bytes:
    """`data` inflated (zlib, gzip or raw deflate by `wbits`), `DECODE_CHUNK` bytes at a time,
    stopping with BodyTooLarge as soon as the output passes `limit`: a gzip bomb costs at
    most `limit` bytes, never what it expands to. Concatenated gzip members are all read."""
    out: list[bytes] = []
    size = 0
    while True:
        d = zlib.decompressobj(wbits)
        tail = data
        while not d.eof:
            piece = d.decompress(tail, DECODE_CHUNK)
            tail = d.unconsumed_tail
            size += len(piece)
            if limit is not None and size > limit:
                raise BodyTooLarge(f"decodes to more than {limit} bytes")
            out.append(piece)
            if not piece and not tail:
                break
        if not d.eof:
            raise zlib.error("incomplete or truncated stream")
        data = d.unused_data
        if wbits & 16 and data[:2] == GZIP_MAGIC:
            continue  # another gzip member
        return b"".join(out)


def _unbrotli(data: bytes, limit: int | None) -> bytes:
    """`data` decoded as brotli, bounded by `limit` like `_inflate`."""
    import brotli

    d = brotli.Decompressor()
    out: list[bytes] = []
    size = 0
    piece = d.process(data, output_buffer_limit=DECODE_CHUNK)
    while True:
        size += len(piece)
        if limit is not None and size > limit:
            raise BodyTooLarge(f"decodes to more than {limit} bytes")
        out.append(piece)
        if d.is_finished() or d.can_accept_more_data():
            break
        piece = d.process(b"", output_buffer_limit=DECODE_CHUNK)
    if not d.is_finished():
        raise ValueError("incomplete brotli stream")
    return b"".join(out)


def _zstd_module():
    """The zstd module Scrapy decodes with (Python 3.14's, else the backport); LookupError
    where neither is installed, as for any coding lait does not know."""
    try:
        from compression import zstd  # type: ignore[import-not-found]
    except ImportError:
        try:
            from backports import zstd  # type: ignore[no-redef]
        except ImportError:
            raise LookupError("zstd") from None
    return zstd


def _unzstd(data: bytes, limit: int | None) -> bytes:
    """`data` decoded as zstd (one or more frames), bounded by `limit` like `_inflate`."""
    zstd = _zstd_module()
    out: list[bytes] = []
    size = 0
    while True:
        d = zstd.ZstdDecompressor()
        piece = d.decompress(data, DECODE_CHUNK)
        while True:
            size += len(piece)
            if limit is not None and size > limit:
                raise BodyTooLarge(f"decodes to more than {limit} bytes")
            out.append(piece)
            if d.eof or d.needs_input:
                break
            piece = d.decompress(b"", DECODE_CHUNK)
        if not d.eof:
            raise ValueError("incomplete zstd stream")
        data = d.unused_data
        if not data:
            return b"".join(out)


def decode_coding(body: bytes, coding: str, limit: int | None = None) -> bytes:
    """`body` with one content coding undone, its output bounded by `limit`.

    Raises BodyTooLarge past the limit, LookupError for a coding lait does not know, and the
    decoder's error (zlib.error, brotli.error) for a damaged body."""
    if coding in ("gzip", "x-gzip"):
        return _inflate(body, 16 + zlib.MAX_WBITS, limit)
    if coding == "deflate":
        try:
            return _inflate(body, zlib.MAX_WBITS, limit)
        except zlib.error:  # raw deflate without the zlib wrapper, as some servers send
            return _inflate(body, -zlib.MAX_WBITS, limit)
    if coding == "br":
        return _unbrotli(body, limit)
    if coding == "zstd":
        return _unzstd(body, limit)
    raise LookupError(coding)


def decode_body(resp: HttpResponse, max_bytes: int | None = None) -> tuple[bytes, str | None]:
    """The payload with transfer and content encodings undone, and a problem note if any.

    Returns (body, None) on success; (body_as_stored, "rule: detail") when an encoding named
    in the headers could not be undone (`content_encoding`), or when a coding decodes to more
    than `max_bytes` (`body_too_large`; decoding stops there, so a compression bomb costs at
    most `max_bytes` per layer of coding). A payload stored without coding is the caller's to
    measure.
    """
    body = resp.body
    te = (resp.header("Transfer-Encoding") or "").lower()
    if "chunked" in te:
        plain = dechunk(body)
        if plain is not None:
            body = plain
    ce = [c.strip() for c in (resp.header("Content-Encoding") or "").lower().split(",") if c.strip()]
    for coding in reversed(ce):
        if coding in ("identity", "none"):
            continue
        try:
            body = decode_coding(body, coding, max_bytes)
        except BodyTooLarge as exc:
            return resp.body, f"body_too_large: {coding!r} body {exc}"
        except LookupError:
            return resp.body, f"content_encoding: unsupported {coding!r}"
        except Exception as exc:  # zlib.error, brotli.error: a damaged or mislabelled body
            return resp.body, f"content_encoding: cannot undo {coding!r}: {_one_line(exc)}"
    return body, None
