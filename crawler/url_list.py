"""URL lists (img2dataset's input) into a work directory's `url_list/` table.

A list names images, one row each: a URL, usually a caption, sometimes the page the image was
found on and columns to keep (LAION, DataComp, CC3M/CC12M metadata). `read_lists` reads CSV,
TSV, JSON lines, Parquet or plain text (one URL a line), local or on object storage,
compressed or not, streaming, and writes

- `url_list/`: one row per usable list row, partitioned by image URL like `images/`:
  image_url and page_url (normalised as the crawler requests them), caption, extra (the kept
  columns as a JSON object), list_file (its path or URL), row (1-based, header not counted);
- `rejected/`: every other row with its reason: `download/bad_url` (empty, not http(s), no
  host, longer than a request may be), `download/bad_page_url` (a page URL given that is not
  one by the same rule: `javascript:`, `data:`, ...; or whose host is an address the crawler
  refuses, `http://169.254.169.254/`, unless allowed as for the fetch), `download/duplicate_url` (the URL of
  an earlier row, in this list or one read before), `download/bad_row` (a line the reader
  cannot parse, or a JSON line whose caption is not a string).

A file that is not a list of its format (a text file named `.parquet`, binary bytes named
`.csv`, a `.jsonl` whose first line is no JSON object, a damaged `.gz`) and a Parquet caption
column that does not hold strings are one-line errors (ConfigError) naming the file, raised by
the first row's read, before the command writes anything: a caption is text, never Python's
repr of a list or a float. Text lists are decoded with the list's encoding (UTF-8 unless
given, `ListText`): a byte that is not text in it is a one-line error naming the file, the
byte offset and the line, never a caption with U+FFFD in it, unless errors "replace" was asked
for, which counts what it replaced.

The images are fetched afterwards by the crawler's fetcher (`lait.crawler.run.fetch_images`);
stage 3 makes each caption a candidate text with source `list`.

One list file is one unit of work, as one archive is for `ingest-warc`: its parts carry a tag
derived from its path, and a marker `WORK/_done/download/TAG.json` (the file's size and
modification time, and the column settings) is written last. A rerun skips a file whose
marker matches and redoes a changed or interrupted one, replacing its parts.
"""

from __future__ import annotations

import bz2
import codecs
import csv
import glob
import gzip
import hashlib
import io
import itertools
import json
import logging
import lzma
import math
import re
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from lait import storage
from lait.config import ConfigError
from lait.errors import CorruptPart
from lait.pagereader import fast_absolute, resolve_slow
from lait.parts import PartitionedWriter
from lait.storage import Location
from lait.workdir import WorkDir, input_done, input_marker
from lait.writers import atomic_write_json

log = logging.getLogger(__name__)

STAGE = "download"
FORMATS = ("txt", "csv", "tsv", "jsonl", "parquet")
COMPRESSIONS = {".gz": lambda f: gzip.GzipFile(fileobj=f), ".bz2": bz2.BZ2File, ".xz": lzma.LZMAFile}
SUFFIX_FORMATS = {".txt": "txt", ".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl",
                  ".ndjson": "jsonl", ".parquet": "parquet"}
# A header cell with a character that decoding replaced, or a control character: binary bytes.
_BINARY = re.compile(r"[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Scrapy drops requests for longer URLs (URLLENGTH_LIMIT) without a word: refused here instead.
MAX_URL_LENGTH = 2083
DEFAULT_ENCODING = "utf-8"


@dataclass
class ListOptions:
    """How list rows are read (img2dataset's names: url_col, caption_col, save_additional_columns)."""

    input_format: str = "auto"
    url_col: str = "url"
    caption_col: str = "caption"  # "" for lists without captions
    page_col: str = ""  # "" for lists without page URLs
    extra_cols: list[str] = field(default_factory=list)
    force: bool = False
    # The fetcher's address allowances, applied to page URLs too (`page_address_problem`).
    allow_loopback: bool = False
    allow_private: bool = False
    # How text lists (csv, tsv, jsonl, txt) are decoded (`ListText`); Parquet holds UTF-8 itself.
    encoding: str = DEFAULT_ENCODING
    encoding_errors: str = "strict"  # or "replace": each undecodable byte sequence read as U+FFFD, counted

    def decoding(self) -> Decoding:
        return Decoding(self.encoding, self.encoding_errors)

    def columns(self) -> list[str]:
        return [c for c in dict.fromkeys([self.url_col, self.caption_col, self.page_col, *self.extra_cols]) if c]

    def text_columns(self) -> list[str]:
        """Columns whose values must be text: the caption (a list or a float is no caption)."""
        return [self.caption_col] if self.caption_col else []


@dataclass
class ListReport:
    """What reading one list produced."""

    path: str
    tag: str
    skipped: bool = False
    rows: int = 0
    kept: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    replaced: int = 0  # undecodable bytes read as U+FFFD (--encoding-errors replace)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- finding and opening lists -------------------------------------------------------------------

def expand_lists(patterns: list[str]) -> list[str]:
    """The list files `patterns` name: paths, URLs and globs of either (`s3://b/laion/*.parquet`);
    each file once, in the order given (a glob's matches sorted). ConfigError for a pattern
    that names nothing."""
    out: list[str] = []
    for pattern in patterns:
        loc = storage.location(pattern)
        has_glob = any(ch in pattern for ch in "*?[")
        if isinstance(loc, storage.RemotePath):
            fs = storage.filesystem(loc)
            found = sorted(fs.glob(loc.url)) if has_glob else ([loc.url] if fs.exists(loc.url) else [])
            found = [f if "://" in f else f"{loc.protocol}://{f}" for f in found]
        else:
            found = sorted(glob.glob(str(loc), recursive=True)) if has_glob else ([str(loc)] if loc.is_file() else [])
        if not found:
            raise ConfigError(f"list {pattern!r}: no such file" + (" (the pattern matches nothing)" if has_glob else ""))
        out.extend(found)
    return list(dict.fromkeys(out))


def _suffixes(path: str) -> tuple[str, str | None]:
    """(format suffix, compression suffix) of a file name: `a.csv.gz` -> (.csv, .gz)."""
    name = path.rsplit("/", 1)[-1].lower()
    comp = next((c for c in COMPRESSIONS if name.endswith(c)), None)
    if comp:
        name = name[: -len(comp)]
    dot = name.rfind(".")
    return (name[dot:] if dot >= 0 else ""), comp


def list_format(path: str, input_format: str = "auto") -> str:
    """The format of a list: `input_format` unless it is auto, else by the file's suffix."""
    if input_format != "auto":
        return input_format
    suffix, _ = _suffixes(path)
    fmt = SUFFIX_FORMATS.get(suffix)
    if fmt is None:
        raise ConfigError(f"list {path}: cannot tell its format from {suffix or 'no suffix'!r}; "
                          f"give --input-format ({', '.join(FORMATS)})")
    return fmt


def check_encoding(encoding: str) -> None:
    """ConfigError unless `encoding` names a text encoding Python knows (`latin-1`, `cp1252`)."""
    try:
        info = codecs.lookup(encoding)
    except LookupError:
        raise ConfigError(f"--encoding {encoding!r}: not an encoding Python knows (utf-8, latin-1, cp1252, "
                          "utf-16, shift_jis, ...)") from None
    if not getattr(info, "_is_text_encoding", True):  # base64, zlib, rot13: bytes-to-bytes codecs
        raise ConfigError(f"--encoding {encoding!r}: not a text encoding")


def _open_binary(loc: Location, path: str) -> io.IOBase:
    raw = storage.open_input(loc)
    _, comp = _suffixes(path)
    return COMPRESSIONS[comp](raw) if comp else raw


# Bytes the decoder replaced so far in this process (`ListText` counts its own as differences).
_REPLACED = [0]


def _counted_replace(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    _REPLACED[0] += exc.end - exc.start
    return "\ufffd", exc.end


codecs.register_error("lait-counted-replace", _counted_replace)


@dataclass
class Decoding:
    """How a text list is decoded (`ListText`), and the bytes it replaced with errors "replace"."""

    encoding: str = DEFAULT_ENCODING
    errors: str = "strict"
    replaced: int = 0


class ListText:
    """The lines of a text list (newlines kept, as `csv` wants them), decoded with the list's
    encoding; a UTF-8 byte-order mark is skipped. Bytes that are not text in that encoding stop
    the read with a ConfigError naming the file, the byte offset and the line; with errors
    "replace" each such byte sequence is read as U+FFFD and counted in `decoding.replaced`."""

    def __init__(self, loc: Location, path: str, fmt: str, decoding: Decoding):
        self.loc, self.path, self.fmt, self.decoding = loc, path, fmt, decoding
        self.encoding = decoding.encoding
        codec = "utf-8-sig" if codecs.lookup(self.encoding).name == "utf-8" else self.encoding
        handler = "lait-counted-replace" if decoding.errors == "replace" else "strict"
        self._file = io.TextIOWrapper(_open_binary(loc, path), encoding=codec, errors=handler, newline="")

    def __enter__(self) -> ListText:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._file.close()

    def __iter__(self) -> Iterator[str]:
        while True:
            before = _REPLACED[0]
            try:
                line = self._file.readline()
            except UnicodeDecodeError as exc:
                raise self._undecodable(exc) from None
            self.decoding.replaced += _REPLACED[0] - before
            if not line:
                return
            yield line

    def _undecodable(self, exc: UnicodeDecodeError) -> ConfigError:
        """The one line for the first bytes that are not text in the encoding: where they are,
        found by decoding the file again up to them (the text reader's chunks hide the offset)."""
        offset, line, bad = undecodable_at(_open_binary(self.loc, self.path), self.encoding)
        name = "UTF-8" if codecs.lookup(self.encoding).name == "utf-8" else self.encoding
        of = " of the uncompressed text" if _suffixes(self.path)[1] else ""
        at = f"byte {bad.hex(' ')} at offset {offset:,}{of}, line {line:,}" if bad else exc.reason
        return ConfigError(f"list {self.path}: not {FORMAT_NAMES.get(self.fmt, self.fmt)} text in {name} ({at}); "
                           "give the list's encoding with --encoding (latin-1, cp1252, ...), or "
                           "--encoding-errors replace to read such bytes as U+FFFD, counted in the summary")


def undecodable_at(f: io.IOBase, encoding: str, chunk: int = 1 << 20) -> tuple[int, int, bytes]:
    """(byte offset, 1-based line, the bytes) of the first bytes of the binary file `f` that
    are not text in `encoding`; (-1, -1, b"") when there are none. Closes `f`."""
    decoder = codecs.getincrementaldecoder(encoding)("strict")
    consumed = lines = 0
    with f:
        while True:
            data = f.read(chunk)
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(data, final=not data)
            except UnicodeDecodeError as exc:
                start = consumed - pending + exc.start  # the error indexes pending + data
                head = exc.object[: exc.start]
                return start, lines + head[pending:].count(b"\n") + 1, bytes(exc.object[exc.start: exc.end])
            if not data:
                return -1, -1, b""
            consumed += len(data)
            lines += data.count(b"\n")


# -- reading rows ------------------------------------------------------------------------------

@dataclass
class RawRow:
    """One row of a list: its number and the values of the wanted columns, or why not."""

    number: int
    values: dict[str, Any] | None = None
    problem: str | None = None


# What a file that is not a list of its format, or whose compression is damaged, raises on
# reading: a ConfigError naming the file instead (`read_rows`).
_UNREADABLE = (OSError, EOFError, lzma.LZMAError, zlib.error, CorruptPart)
FORMAT_NAMES = {"txt": "text", "csv": "CSV", "tsv": "TSV", "jsonl": "JSON lines", "parquet": "Parquet"}


def read_rows(path: str, fmt: str, columns: list[str], typed: Sequence[str] = (),
              text: Sequence[str] = (), decoding: Decoding | None = None) -> Iterator[RawRow]:
    """The rows of a list, streaming. ConfigError, one line naming the file, when a wanted
    column is missing, when the file is not a list of its format (a text file named `.parquet`,
    binary bytes named `.csv`, a `.jsonl` whose first line is no JSON object, a damaged `.gz`),
    and when a column of `text` (the caption) has a Parquet type that is not text. `typed`:
    the columns whose CSV or TSV text becomes the numbers and booleans pyarrow's CSV reader
    makes of it (`csv_types`), as img2dataset reads such lists; Parquet and JSON carry their
    own types. A JSON value of a `text` column that is not a string (a list, a number) makes
    its row a problem, never Python's repr of it. `decoding`: how a text list is decoded (UTF-8,
    strict, by default: bytes that are not UTF-8 are a ConfigError naming where they are)."""
    import pyarrow as pa

    try:
        yield from _read_rows(path, fmt, columns, typed, text, decoding or Decoding())
    except (*_UNREADABLE, pa.ArrowException) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"list {path}: not a readable {FORMAT_NAMES.get(fmt, fmt)} file{_compressed(path)} "
                          f"({_why(exc)})") from exc


def _compressed(path: str) -> str:
    _, comp = _suffixes(path)
    return f" compressed as {comp}" if comp else ""


def _why(exc: BaseException) -> str:
    why = exc.detail if isinstance(exc, CorruptPart) else (str(exc) or type(exc).__name__)
    return " ".join(why.split())[:200]


def _read_rows(path: str, fmt: str, columns: list[str], typed: Sequence[str], text: Sequence[str],
               decoding: Decoding) -> Iterator[RawRow]:
    loc = storage.location(path)
    if fmt == "parquet":
        yield from _parquet_rows(loc, path, columns, text)
    elif fmt == "jsonl":
        yield from _jsonl_rows(ListText(loc, path, fmt, decoding), path, columns, text)
    elif fmt in ("csv", "tsv"):
        yield from _csv_rows(ListText(loc, path, fmt, decoding), path, columns, "\t" if fmt == "tsv" else ",", typed)
    elif fmt == "txt":
        if columns[1:]:
            raise ConfigError(f"list {path}: a txt list holds URLs only, one a line; it has no "
                              f"column {columns[1]!r} (set --caption-col '' or use csv)")
        with ListText(loc, path, fmt, decoding) as f:
            n = 0
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    n += 1
                    yield RawRow(n, {columns[0]: line})
    else:
        raise ConfigError(f"unknown list format {fmt!r}; known: {', '.join(FORMATS)}")


def check_not_empty(path: str, fmt: str, columns: list[str], text: Sequence[str] = (),
                    decoding: Decoding | None = None) -> None:
    """ConfigError when a list holds no row at all (an empty file, a header alone, comments
    only), or cannot be read as its format (`read_rows`): a command given nothing to do, or
    the wrong file, says so at once, before it writes anything. Reads up to the first row only."""
    rows = read_rows(path, fmt, columns, text=text, decoding=decoding)
    try:
        first = next(rows, None)
    finally:
        rows.close()
    if first is None:
        raise ConfigError(f"list {path}: holds no URL (no row" + (" below its header" if fmt in ("csv", "tsv") else "")
                          + "); nothing to download")


def _missing(path: str, wanted: list[str], have: list[str]) -> ConfigError:
    missing = [c for c in wanted if c not in have]
    return ConfigError(f"list {path}: no column {', '.join(map(repr, missing))}; its columns are "
                       f"{', '.join(map(repr, have[:30]))} (name yours with --url-col, --caption-col, "
                       "--page-col, --save-additional-columns; --caption-col '' for no captions)")


# How much of a CSV list its column types are inferred from: pyarrow's CSV reader infers them
# from its first block, a mebibyte by default.
TYPE_SAMPLE_BYTES = 1 << 20


def csv_types(sample: list[str], delimiter: str, typed: Sequence[str]) -> dict[str, Callable[[str], Any]]:
    """For each column of `typed` that pyarrow's CSV reader reads as integers, floats, booleans
    or nulls from `sample` (the header and the first lines), how a text value becomes that type;
    a value that does not fit stays text. Columns read as text (or a sample pyarrow cannot
    parse) are left out: their values stay as they are."""
    if not typed:
        return {}
    import pyarrow as pa
    from pyarrow import csv as pacsv

    defaults = pacsv.ConvertOptions()
    nulls, trues, falses = set(defaults.null_values), set(defaults.true_values), set(defaults.false_values)
    try:
        table = pacsv.read_csv(
            io.BytesIO("".join(sample).encode("utf-8", "surrogatepass")),
            read_options=pacsv.ReadOptions(use_threads=False),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True,
                                              invalid_row_handler=lambda _row: "skip"),
            convert_options=pacsv.ConvertOptions(include_columns=list(typed)))
    except (pa.ArrowException, ValueError):
        return {}

    def number(kind: type) -> Callable[[str], Any]:
        def convert(text: str) -> Any:
            if text in nulls:
                return None
            try:
                return kind(text)
            except ValueError:
                return text
        return convert

    def boolean(text: str) -> Any:
        return True if text in trues else False if text in falses else None if text in nulls else text

    out: dict[str, Callable[[str], Any]] = {}
    for f in table.schema:
        if pa.types.is_integer(f.type):
            out[f.name] = number(int)
        elif pa.types.is_floating(f.type):
            out[f.name] = number(float)
        elif pa.types.is_boolean(f.type):
            out[f.name] = boolean
        elif pa.types.is_null(f.type):
            out[f.name] = lambda text: None if text in nulls else text
    return out


def _csv_rows(lines: ListText, path: str, columns: list[str], delimiter: str,
              typed: Sequence[str] = ()) -> Iterator[RawRow]:
    csv.field_size_limit(1 << 24)
    with lines as f:
        sample: list[str] = []
        size = 0
        for line in f:
            sample.append(line)
            size += len(line)
            if size >= TYPE_SAMPLE_BYTES:
                break
        reader = csv.reader(itertools.chain(sample, f), delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            return
        header = [h.strip() for h in header]
        if any(_BINARY.search(h) for h in header):  # control characters, or bytes replaced (errors replace)
            name = "TSV" if delimiter == "\t" else "CSV"
            raise ConfigError(f"list {path}: not {name} text: its first line holds bytes that are not "
                              f"{lines.encoding} text (a binary file?); a list needs a header row naming its columns")
        if any(c not in header for c in columns):
            raise _missing(path, columns, header)
        index = {c: header.index(c) for c in columns}
        types = csv_types(sample, delimiter, [c for c in typed if c in index])
        n = 0
        while True:
            n += 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield RawRow(n, problem=f"unreadable line: {exc}")
                continue
            if not row or (len(row) == 1 and not row[0].strip()):
                n -= 1  # a blank line is no row
                continue
            if len(row) != len(header):
                yield RawRow(n, problem=f"{len(row)} fields where the header has {len(header)}")
                continue
            values = {c: row[i] for c, i in index.items()}
            for c, convert in types.items():
                values[c] = convert(values[c])
            yield RawRow(n, values)


_JSON_TYPES = {dict: "object", list: "list", str: "string", int: "number", float: "number", bool: "boolean"}


def _jsonl_rows(lines: ListText, path: str, columns: list[str], text: Sequence[str] = ()) -> Iterator[RawRow]:
    with lines as f:
        n = 0
        checked = False
        for line in f:
            if not line.strip():
                continue
            n += 1
            try:
                obj = json.loads(line)
            except ValueError as exc:
                problem = f"not JSON: {exc}"
            else:
                problem = None if isinstance(obj, dict) else f"a JSON {_JSON_TYPES.get(type(obj), 'null')}, not an object"
            if problem is not None:
                if not checked:  # its first line is no object: the file is no JSON lines at all
                    raise ConfigError(f"list {path}: not JSON lines: its first line is {problem}"[:400])
                yield RawRow(n, problem=problem)
                continue
            if not checked:  # JSON lines have no header: the first object names the columns
                if any(c not in obj for c in columns):
                    raise _missing(path, columns, list(obj))
                checked = True
            bad = next((c for c in text if obj.get(c) is not None and not isinstance(obj[c], str)), None)
            if bad is not None:
                yield RawRow(n, problem=f"its {bad!r} is a JSON {_JSON_TYPES.get(type(obj[bad]), 'value')}, not text")
                continue
            yield RawRow(n, {c: obj.get(c) for c in columns})


def _is_text(t) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t) or pa.types.is_null(t)


def _parquet_rows(loc: Location, path: str, columns: list[str], text: Sequence[str] = ()) -> Iterator[RawRow]:
    pf = storage.parquet_file(loc)
    schema = pf.schema_arrow
    have = schema.names
    if any(c not in have for c in columns):
        raise _missing(path, columns, have)
    for c in text:
        if c in have and not _is_text(schema.field(c).type):
            # One type for every row: a wrong --caption-col, said once rather than as a reject per row.
            raise ConfigError(f"list {path}: column {c!r} holds {schema.field(c).type}, not text; a caption "
                              f"column must hold strings (name another with --caption-col, or '' for none)")
    n = 0
    for batch in pf.iter_batches(batch_size=8192, columns=columns):
        for values in batch.to_pylist():
            n += 1
            yield RawRow(n, values)


# -- list rows into tables ---------------------------------------------------------------------

def normalise_url(raw: Any) -> tuple[str | None, str | None]:
    """(the URL as the crawler requests it, None) or (None, why it cannot be fetched)."""
    if raw is None or not str(raw).strip():
        return None, "empty URL"
    text = str(raw).strip()
    if len(text) > MAX_URL_LENGTH:
        return None, f"longer than {MAX_URL_LENGTH} characters"
    url = fast_absolute(text) or resolve_slow(text, text)
    if url is None:
        return None, "no host" if text[:8].lower().startswith(("http://", "https://")) else "not an http(s) URL"
    try:
        host = urlsplit(url).hostname
    except ValueError:
        host = None
    if not host:
        return None, "no host"
    if len(url) > MAX_URL_LENGTH:
        return None, f"longer than {MAX_URL_LENGTH} characters once escaped"
    return url, None


def page_address_problem(url: str, opts: ListOptions) -> str | None:
    """Why a page URL may not be kept, or None: its host is an address the crawler would refuse
    to connect to (`lait.crawler.addresses`: loopback, private, link-local, metadata, reserved)
    under the run's allowances. Only hosts that are addresses are judged (names are not looked
    up: a page URL is never requested); the page URL reaches shard JSON and the report's links."""
    from lait.crawler.addresses import AddressPolicy, literal_address

    address = literal_address(urlsplit(url).hostname)
    if address is None:
        return None
    kind = AddressPolicy(allow_loopback=opts.allow_loopback, allow_private=opts.allow_private).refusal([str(address)])
    if kind is None:
        return None
    allow = {"loopback": " (allow with --allow-loopback)", "metadata": ""}.get(kind, " (allow with --allow-private)")
    return f"names a {kind.replace('_', '-')} address ({address}), one the crawler refuses{allow}"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return text if text.strip() else None


def _finite(value: Any) -> Any:
    """`value` with every NaN and infinity as None: JSON has no NaN (`NaN` is no JSON a strict
    reader takes, and shard JSON refuses it), and a float column's NaN means a missing value, as
    pandas' and Arrow's JSON writers have it (LAION's `punsafe`, say)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def file_tag(path: str) -> str:
    """Part tag of a list: readable stem plus a hash of its location."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.rsplit("/", 1)[-1])[:48]
    digest = hashlib.blake2b(path.encode("utf-8", "surrogatepass"), digest_size=5).hexdigest()
    return f"list-{stem}-{digest}"


def marker_path(work: WorkDir, tag: str) -> Location:
    return input_marker(work, STAGE, tag)


def _fingerprint(path: str, opts: ListOptions) -> dict[str, Any]:
    loc = storage.location(path)
    if isinstance(loc, storage.RemotePath):
        info = storage.filesystem(loc).info(loc.url)
        version = str(info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime"))
        size = int(info.get("size") or 0)
    else:
        st = loc.stat()
        version, size = str(st.st_mtime_ns), st.st_size
    settings = {k: v for k, v in asdict(opts).items() if k != "force"}
    # The default decoding is how lists were read before these settings: their markers stay current.
    if codecs.lookup(settings["encoding"]).name == codecs.lookup(DEFAULT_ENCODING).name:
        del settings["encoding"]
    if settings["encoding_errors"] == "strict":
        del settings["encoding_errors"]
    return {"path": path, "size": size, "version": version, "settings": settings}


def is_read(work: WorkDir, path: str, opts: ListOptions) -> bool:
    """True when `path` was read into `work` with these settings and has not changed since."""
    return input_done(work, STAGE, file_tag(path), _fingerprint(path, opts))


class _UrlSet:
    """The URLs kept so far, as 8-byte digests (a LAION part's worth in tens of MB)."""

    def __init__(self) -> None:
        self._seen: dict[int, str] = {}

    @staticmethod
    def _key(url: str) -> int:
        return int.from_bytes(hashlib.blake2b(url.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")

    def first(self, url: str) -> str | None:
        """Where `url` was kept before (`file row N`), or None."""
        return self._seen.get(self._key(url))

    def add(self, url: str, where: str) -> None:
        self._seen[self._key(url)] = where


def read_lists(paths: list[str], work: WorkDir, opts: ListOptions, *, show_progress: bool = True) -> list[ListReport]:
    """Read every list into `url_list/` and `rejected/` (the caller holds the work directory's
    lock); lists already read, unchanged, are skipped."""
    from lait.log import progress

    formats = {p: list_format(p, opts.input_format) for p in paths}
    todo = [p for p in paths if opts.force or not is_read(work, p, opts)]
    for p in todo:  # their earlier parts go first, so that duplicates are judged afresh
        for table in ("url_list", "rejected"):
            work.remove_parts(table, file_tag(p))
        storage.remove(marker_path(work, file_tag(p)))
    seen = _UrlSet()
    for row in work.iter_rows("url_list", columns=["image_url", "list_file", "row"], batch_size=8192):
        seen.add(row["image_url"], f"{row['list_file'].rsplit('/', 1)[-1]} row {row['row']}")
    reports = []
    bar = progress(desc="download: lists", unit=" rows", disable=not show_progress)
    try:
        for p in paths:
            if p not in todo:
                reports.append(ListReport(p, file_tag(p), skipped=True))
                continue
            reports.append(_read_list(p, formats[p], work, opts, seen, bar))
    finally:
        bar.close()
    return reports


def _read_list(path: str, fmt: str, work: WorkDir, opts: ListOptions, seen: _UrlSet, bar) -> ListReport:
    start = time.perf_counter()
    tag = file_tag(path)
    name = path.rsplit("/", 1)[-1]
    report = ListReport(path, tag)
    rejected: Counter[str] = Counter()
    parts = PartitionedWriter(work, tag, row_group_bytes=8 << 20, extra_stats={"stage": STAGE, "list_file": path})

    def reject(rule: str, key: str, detail: str, **ids: Any) -> None:
        parts.reject(f"{STAGE}/{rule}", parts.partition_of(key), detail=f"{name} {detail}", **ids)
        rejected[f"{STAGE}/{rule}"] += 1

    decoding = opts.decoding()
    try:
        for raw in read_rows(path, fmt, opts.columns(), typed=opts.extra_cols, text=opts.text_columns(),
                             decoding=decoding):
            report.rows += 1
            bar.update(1)
            where = f"row {raw.number}"
            if raw.values is None:
                reject("bad_row", f"{path}#{raw.number}", f"{where}: {raw.problem}")
                continue
            v = raw.values
            caption = _text(v.get(opts.caption_col)) if opts.caption_col else None
            raw_page = _text(v.get(opts.page_col)) if opts.page_col else None
            url, problem = normalise_url(v.get(opts.url_col))
            if url is None:
                raw_url = _text(v.get(opts.url_col))
                reject("bad_url", raw_url or f"{path}#{raw.number}", f"{where}: {problem}",
                       image_url=raw_url, page_url=raw_page, text=caption)
                continue
            # The page URL reaches shard JSON and the report's links: the same rule as the image's.
            page, problem = normalise_url(raw_page) if raw_page else (None, None)
            if page is not None:
                problem = page_address_problem(page, opts)
                page = None if problem else page
            if raw_page and page is None:
                reject("bad_page_url", url, f"{where}: page URL {problem}", image_url=url,
                       page_url=raw_page, text=caption)
                continue
            first = seen.first(url)
            if first is not None:
                reject("duplicate_url", url, f"{where}: the URL of {first}", image_url=url, page_url=page,
                       text=caption)
                continue
            seen.add(url, f"{name} row {raw.number}")
            extra = {c: v.get(c) for c in opts.extra_cols}
            parts.write("url_list", parts.partition_of(url), {
                "image_url": url, "caption": caption, "page_url": page,
                "extra": json.dumps(_finite(extra), ensure_ascii=False, allow_nan=False, default=str) if extra else None,
                "list_file": path, "row": raw.number})
            report.kept += 1
        parts.close()
    except BaseException:
        parts.abort()
        raise
    report.rejected = dict(sorted(rejected.items()))
    report.replaced = decoding.replaced
    if decoding.replaced:
        log.warning("list %s: %d bytes that are not %s text read as U+FFFD (--encoding-errors replace)",
                    path, decoding.replaced, opts.encoding)
    report.seconds = round(time.perf_counter() - start, 3)
    atomic_write_json(marker_path(work, tag), {**_fingerprint(path, opts), "report": report.to_dict()})
    return report
