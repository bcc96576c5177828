"""Common Crawl WARC/WAT archives into the crawler's tables: `pages/`, `images/`, `warc_links/`.

One archive file is one unit of work (`ingest_file`), like a partition for a stage: its parts
carry a tag derived from the file's path, appear atomically, and a marker
`WORK/_done/ingest-warc/TAG.json` (with the file's size and mtime) is written last. A rerun
skips a file whose marker matches; an interrupted or changed file is redone, its earlier parts
replaced. Rows are partitioned exactly like the crawler's: pages by page URL, images and links
by image URL.

What goes where:

- `response`/`resource` records with HTML -> `pages/`, and the URLs of their images ->
  `warc_links/` (see `lait.crawler.warc_links`).
- records with an image (by Content-Type, else by magic bytes) -> `images/`.
- Rows of both keep status and headers; `html`/`bytes` are stored exactly when `error` is
  None. Otherwise `error` says why, in the crawl's vocabulary (`lait.reasons`): `http_404`
  (any non-2xx), `noai` (`noai` / `noimageai` in the captured `X-Robots-Tag` or, for a page,
  its robots meta tag, read by `lait.pagereader` as the crawler reads them; no links are kept
  from such a page), `tdm_reserved` (a `tdm-reservation: 1` header or, for a page, meta tag:
  W3C TDMRep, as the crawler honours it), `empty` (an image with no bytes). A page row keeps
  the licence the page declares (`license`), as the crawl's do.
- payloads are decoded (chunked, gzip, deflate, br, zstd) within the crawler's size limits
  (`max_page_bytes`, `max_image_bytes`): decoding stops at the limit, so a compression bomb
  costs at most that much memory, and the record is an `ingest/body_too_large` reject.
- WAT `metadata` records (JSON) -> `warc_links/` from their `IMG@` links; a WAT record with
  noai has no page body to keep as a pages/ row: it is a reject `ingest/noai_page`.
- damage (truncated, malformed records, broken gzip, unreadable files) -> `ingest/RULE`
  rejects and the file's report; a truncated payload is never stored.
- revisit, request, warcinfo, conversion (WET) records, CSS/JS/fonts: counted, not stored.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from lait import storage
from lait.crawler import archive_inputs
from lait.crawler.exclusions import DOMAIN, load_lists
from lait.crawler.reasons import ERROR_TDM_RESERVED
from lait.crawler.warc import HttpError, WarcReader, WarcRecord, decode_body, parse_http
from lait.crawler.warc_links import WatPage, image_links, iter_link_rows, wat_image_links
from lait.lock import locked
from lait.pagereader import (
    is_noai,
    is_tdm_reserved,
    page_license,
    page_meta,
    parse_page,
    robots_directives,
    tdm_reservation,
)
from lait.parts import PartitionedWriter
from lait.reasons import http_error
from lait.rules import Filter, KeepResult, first_rejection
from lait.storage import Location
from lait.urls import is_http_url
from lait.workdir import WorkDir, input_done, input_marker
from lait.writers import atomic_write_json

log = logging.getLogger(__name__)

STAGE = "ingest-warc"
OUTPUT_TABLES = ("pages", "images", "warc_links", "rejected")
HTML_MIMES = {"text/html", "application/xhtml+xml"}
# Sniffed when the Content-Type is missing or generic (application/octet-stream).
IMAGE_MAGIC = [(b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
               (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"), (b"BM", "image/bmp"),
               (b"II*\x00", "image/tiff"), (b"MM\x00*", "image/tiff")]


@dataclass
class IngestOptions:
    """How a file is ingested (picklable: it travels to worker processes)."""

    links: bool = True
    max_record_bytes: int = 64 << 20
    # The crawler's size limits (`lait crawl --max-page-bytes/--max-image-bytes`): a payload
    # larger, or decoding to more, is rejected as ingest/body_too_large.
    max_page_bytes: int = 10 << 20
    max_image_bytes: int = 20 << 20
    obey_tdmrep: bool = True
    check_gzip: bool = True
    force: bool = False
    # Block list files (`--exclude-domains`, `--exclude-urls`): no record of a listed URL is stored.
    exclude_domains: str = ""
    exclude_urls: str = ""


@dataclass
class FileReport:
    """What ingesting one archive produced; `failed` only for errors of lait itself."""

    path: str
    tag: str
    skipped: bool = False
    readers: list[str] = field(default_factory=list)
    records: int = 0
    pages: int = 0
    images: int = 0
    links: int = 0
    rejected: int = 0
    damage: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    failed: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def file_tag(path: str | Path) -> str:
    """Part tag of an archive: readable stem plus a hash of its absolute path (or URL)."""
    ident = archive_inputs.identity(str(path))
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", archive_inputs.archive_name(ident))[:48]
    digest = hashlib.blake2b(ident.encode("utf-8", "surrogatepass"), digest_size=5).hexdigest()
    return f"warc-{stem}-{digest}"


def marker_path(work: WorkDir, tag: str) -> Location:
    return input_marker(work, STAGE, tag)


def _fingerprint(path: str | Path) -> dict[str, Any]:
    return archive_inputs.fingerprint(str(path))


def is_ingested(work: WorkDir, path: str | Path) -> bool:
    """True when `path` (a local file or an archive URL) was fully ingested into `work` and
    has not changed since."""
    return input_done(work, STAGE, file_tag(path), _fingerprint(path))


def _parse_date(value: str | None) -> datetime:
    if value:
        try:
            d = datetime.fromisoformat(value.strip())
            return d.replace(tzinfo=UTC) if d.tzinfo is None else d.astimezone(UTC)
        except ValueError:
            pass
        if re.fullmatch(r"\d{14}", value.strip()):  # ARC dates: YYYYMMDDhhmmss
            return datetime.strptime(value.strip(), "%Y%m%d%H%M%S").replace(tzinfo=UTC)
    return datetime.now(UTC)


def _mime(content_type: str | None) -> tuple[str | None, str | None]:
    """(lower-case media type, charset) of a Content-Type value."""
    if not content_type:
        return None, None
    parts = [p.strip() for p in content_type.split(";")]
    charset = None
    for p in parts[1:]:
        k, _, v = p.partition("=")
        if k.strip().lower() == "charset" and v.strip():
            charset = v.strip().strip("\"'").lower()
    return parts[0].lower() or None, charset


def _sniff(body: bytes) -> str | None:
    for magic, mime in IMAGE_MAGIC:
        if body.startswith(magic):
            return mime
    if body[:4] == b"RIFF" and body[8:12] == b"WEBP":
        return "image/webp"
    head = body[:512].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html")):
        return "text/html"
    return None


class HttpUrl(Filter):
    """A capture or WAT page whose URL is not http(s): a javascript: or file: target would
    become a page or image URL."""

    name = "bad_url"

    def __init__(self, field: str):
        self.field = field  # where the URL came from, for the detail

    def keep(self, record: Any) -> KeepResult:
        return is_http_url(record.url) or (False, f"{self.field} is not an http(s) URL")


class OnBlockList(Filter):
    """A URL on the block lists (`--exclude-domains`, `--exclude-urls`): no record of it is
    stored; the images a page links to are refused, if at all, by the fetcher's own check."""

    name = "excluded_domain"  # or, as `keep` says, excluded_url
    rules = ("excluded_domain", "excluded_url")

    def __init__(self, exclusions):
        self.exclusions = exclusions

    def keep(self, record: Any) -> KeepResult:
        hit = self.exclusions.match(record.url) if self.exclusions else None
        if hit is None:
            return True
        return False, f"on the {hit[0]} block list (entry {hit[1]!r})", \
            "excluded_domain" if hit[0] == DOMAIN else "excluded_url"


class NoaiPage(Filter):
    """A WAT page that opts out of AI use (`noai` / `noimageai` in its X-Robots-Tag, then in
    its robots meta tag, read as `lait.pagereader` reads a crawled page's)."""

    name = "noai_page"

    def keep(self, page: WatPage) -> KeepResult:
        if is_noai(robots_directives(page.x_robots_tag)):
            return False, f"X-Robots-Tag: {page.x_robots_tag}"
        if is_noai(robots_directives(page.robots_meta)):
            return False, f"robots meta: {page.robots_meta}"
        return True


class TdmReservedPage(Filter):
    """A WAT page with a W3C TDMRep reservation (header or meta tag), as the crawler honours it."""

    name = "tdm_reserved_page"

    def keep(self, page: WatPage) -> KeepResult:
        reserved = is_tdm_reserved(tdm_reservation(page.tdm_header), tdm_reservation(page.tdm_meta))
        return not reserved or (False, "tdm-reservation: 1 (header or meta tag)")


class _Target(NamedTuple):
    url: str


class _FileIngest:
    """The parts and counters of one archive being ingested."""

    def __init__(self, work: WorkDir, path: str, tag: str, opts: IngestOptions):
        self.work, self.path, self.tag, self.opts = work, path, tag, opts
        self.name = archive_inputs.archive_name(path)
        self.counters: Counter[str] = Counter()
        self.max_body = max(opts.max_page_bytes, opts.max_image_bytes)
        excluded = OnBlockList(load_lists(opts.exclude_domains, opts.exclude_urls))
        # The single-record rules, in the order they are checked: a capture's URL first, its block
        # lists once its type is known (other types are only counted); a WAT page's all at once.
        self.capture_url = [HttpUrl("WARC-Target-URI")]
        self.listed = [excluded]
        self.wat_filters = [HttpUrl("WAT page URL"), excluded, NoaiPage(),
                            *([TdmReservedPage()] if opts.obey_tdmrep else [])]
        # Small row groups: up to partitions x tables parts are open at once.
        self.parts = PartitionedWriter(work, tag, row_group_bytes=8 << 20,
                                       extra_stats={"stage": STAGE, "warc_file": str(path)})

    def write(self, table: str, key: str, row: dict[str, Any]) -> None:
        self.parts.write(table, self.parts.partition_of(key), row)
        self.counters[f"ingest/out_{table}"] += 1

    def reject(self, rule: str, *, key: str, image_url: str | None = None, page_url: str | None = None,
               detail: str | None = None) -> None:
        reason = self.parts.reject(f"ingest/{rule}", self.parts.partition_of(key), image_url=image_url,
                                   page_url=page_url, detail=detail)
        self.counters["ingest/out_rejected"] += 1
        self.counters[reason] += 1

    def dropped(self, filters: list[Filter], record: Any, **ids: str | None) -> bool:
        """Whether a rule of `filters` drops `record` (its `url`); the drop is recorded."""
        drop = first_rejection(filters, record)
        if drop is not None:
            self.reject(drop.rule, key=record.url, detail=drop.detail, **ids)
        return drop is not None

    # -- records ---------------------------------------------------------------------------
    def record(self, rec: WarcRecord) -> None:
        self.counters[f"ingest/record_{rec.type}"] += 1
        if rec.block is None:
            if rec.too_large and rec.url:
                self.reject("too_large", key=rec.url, page_url=rec.url,
                            detail=f"{rec.declared_length} bytes > {self.opts.max_record_bytes}")
            return
        if rec.truncated or rec.declared_length is None:
            return  # the reader recorded the damage; a partial payload is never stored
        if rec.type == "metadata":
            self.wat(rec)
        elif rec.type in ("response", "resource") and rec.url:
            self.capture(rec)

    def capture(self, rec: WarcRecord) -> None:
        url = rec.url.strip()
        if self.dropped(self.capture_url, _Target(url), page_url=url):
            return
        fetched_at = _parse_date(rec.date)
        if rec.type == "response" and (rec.content_type or "application/http").startswith("application/http"):
            try:
                resp = parse_http(rec.block)
            except HttpError as exc:
                self.reject("bad_http", key=url, page_url=url, detail=str(exc))
                return
            status, headers = resp.status, resp.headers
            content_type = resp.header("Content-Type")
            robots = resp.header("X-Robots-Tag")
            tdm = tdm_reservation(resp.header("tdm-reservation"))
            # Decoded within the crawler's size limits: a compression bomb stops there.
            body, problem = decode_body(resp, self.max_body) if 200 <= status < 300 else (resp.body, None)
        else:  # a resource record (or a response without HTTP): the block is the payload
            status, headers, content_type, robots, tdm = 200, [], rec.content_type, None, None
            body, problem = rec.block, None
        mime, charset = _mime(content_type)
        if mime not in HTML_MIMES and not (mime or "").startswith("image/"):
            if mime in (None, "application/octet-stream", "binary/octet-stream", "text/plain"):
                mime = _sniff(body) or mime
        is_page = mime in HTML_MIMES
        is_image = (mime or "").startswith("image/")
        if not (is_page or is_image):
            self.counters["ingest/skipped_other_type"] += 1
            return
        if self.dropped(self.listed, _Target(url), **({"page_url": url} if is_page else {"image_url": url})):
            return
        limit = self.opts.max_page_bytes if is_page else self.opts.max_image_bytes
        if problem is None and 200 <= status < 300 and len(body) > limit:
            problem = f"body_too_large: {len(body)} bytes > {limit}"
        # The crawl's order and vocabulary (lait.reasons): a non-2xx status first, then the
        # opt-outs (noai, then TDMRep), then what cannot be stored.
        error = http_error(status)
        if error is None and is_noai(robots_directives(robots)):
            error = "noai"
        elif error is None and self.opts.obey_tdmrep and tdm:
            error = ERROR_TDM_RESERVED
        elif problem:  # an encoding that cannot be undone, or a body over the size limit
            rule = "body_too_large" if problem.startswith("body_too_large:") else "content_encoding"
            detail = problem.partition(": ")[2]
            kw = {"page_url": url} if is_page else {"image_url": url}
            self.reject(rule, key=url, detail=detail, **kw)
            return
        if is_page:
            self._page(url, status, headers, content_type, charset, body, error, fetched_at, tdm)
        else:
            if error is None and not body:
                error = "empty"
            if error is not None:
                self.counters[f"ingest/image_{error}"] += 1
            self.write("images", url, {
                "image_url": url, "page_url": None, "bytes": body if error is None else None, "mime": mime,
                "status": status, "fetched_at": fetched_at, "error": error})

    def _page(self, url: str, status: int, headers: list[tuple[str, str]], content_type: str | None,
              charset: str | None, body: bytes, error: str | None, fetched_at: datetime,
              tdm_header: bool | None = None) -> None:
        """A pages row with the licence the page declares; with noai (header or robots meta)
        or a TDM reservation (header or meta) the row without its HTML or links."""
        tree, too_deep = parse_page(body, charset) if error is None else (None, False)
        license_ = None
        if tree is not None:
            robots, reservation, _ = page_meta(tree)
            license_ = page_license(tree, url)
            if is_noai(robots):
                error, tree = "noai", None
            elif self.opts.obey_tdmrep and is_tdm_reserved(tdm_header, reservation):
                error, tree = ERROR_TDM_RESERVED, None
        if tree is not None and too_deep:
            self.reject("too_deep", key=url, page_url=url,
                        detail="nested deeper than 256 elements: the images below were not read")
        if error is not None:
            self.counters[f"ingest/page_{error}"] += 1
        merged: dict[str, str] = {}
        for k, v in headers:
            k = k.lower()
            merged[k] = f"{merged[k]}, {v}" if k in merged else v
        stored = error is None
        self.write("pages", url, {
            "url": url, "status": status, "fetched_at": fetched_at, "headers": merged,
            "content_type": content_type, "html": body if stored else None,
            "encoding": charset if stored else None, "depth": None, "referer": None, "error": error,
            "license": license_})
        if tree is not None and self.opts.links:
            self._links(url, image_links(tree, url), fetched_at)

    def wat(self, rec: WarcRecord) -> None:
        if not (rec.content_type or "").lower().startswith("application/json"):
            return  # WARC metadata of other kinds (crawl logs, outlinks as text)
        try:
            page = wat_image_links(rec.block, rec.url)
        except (ValueError, AttributeError, TypeError) as exc:
            self.reject("bad_wat", key=rec.url or str(self.path), page_url=rec.url, detail=str(exc)[:300])
            return
        if page is None:
            self.counters["ingest/wat_no_html"] += 1
            return
        # A WAT record has no page body to keep as a pages/ row: an opted-out page is a reject.
        if self.dropped(self.wat_filters, page, page_url=page.url):
            return
        self._links(page.url, page.links, _parse_date(rec.date), page_title=page.title, page_lang=page.lang)

    def _links(self, page_url: str, links, fetched_at: datetime, **page) -> None:
        for row in iter_link_rows(page_url, links, fetched_at, self.name, **page):
            self.write("warc_links", row["image_url"], row)

    # -- end -------------------------------------------------------------------------------
    def close(self) -> dict[str, int]:
        return self.parts.close()

    def abort(self) -> None:
        self.parts.abort()


def ingest_file(path: str | Path, work_root: str | Location, opts: IngestOptions | None = None) -> FileReport:
    """Ingest one archive (a local file, or a URL: `lait.crawler.archive_inputs`) into a work
    directory; the unit of work of `lait ingest-warc`.

    Never raises for bad archive content (that is damage in the report); an unexpected error
    of lait itself is caught, its partial parts removed, and reported in `failed`.
    """
    opts = opts or IngestOptions()
    path = str(path)
    work = WorkDir(work_root)
    tag = file_tag(path)
    report = FileReport(path, tag)
    fingerprint = _fingerprint(path)  # before reading: a file that changes meanwhile is redone next time
    if not opts.force and input_done(work, STAGE, tag, fingerprint):
        report.skipped = True
        return report
    start = time.perf_counter()
    for table in OUTPUT_TABLES:
        work.remove_parts(table, tag)
    storage.remove(marker_path(work, tag))
    job = _FileIngest(work, path, tag, opts)
    try:
        with archive_inputs.local_file(path) as local:
            reader = WarcReader(local, max_record_bytes=opts.max_record_bytes, check_gzip=opts.check_gzip)
            for rec in reader:
                job.record(rec)
        for d in reader.damage:
            key = d.url or path
            job.reject(d.rule, key=key, page_url=d.url,
                       detail=f"{job.name}" + (f" record {d.record}" if d.record is not None else "")
                       + f": {d.detail}")
            report.damage.append(f"{d.rule}: " + (f"record {d.record}: " if d.record is not None else "")
                                 + d.detail)
        outputs = job.close()
    except Exception as exc:  # a bug or an I/O error of ours: report it, keep the other files going
        job.abort()
        log.exception("ingest of %s failed", path)
        report.failed = f"{type(exc).__name__}: {exc}"
        report.seconds = round(time.perf_counter() - start, 3)
        return report
    report.readers = reader.readers
    report.records = reader.records
    report.pages = outputs.get("pages", 0)
    report.images = outputs.get("images", 0)
    report.links = outputs.get("warc_links", 0)
    report.rejected = outputs.get("rejected", 0)
    report.counters = dict(sorted(job.counters.items()))
    report.seconds = round(time.perf_counter() - start, 3)
    atomic_write_json(marker_path(work, tag), {**fingerprint, "report": report.to_dict()})
    return report


def _ingest_unit(path: str, work_url: str, opts: IngestOptions) -> FileReport:
    """A Ray task: one archive file (its parts and marker), written on behalf of the driver
    that holds the lock; a file that fails is its report, as in the process pool."""
    return ingest_file(path, work_url, opts)


def ingest_files(paths: list[str | Path], work_root: str | Location, opts: IngestOptions | None = None, *,
                 workers: int = 1, show_progress: bool = True, executor: str = "local",
                 ray_address: str | None = None) -> list[FileReport]:
    """Ingest several archives, `workers` at a time in a process pool, or one Ray task each
    (`executor="ray"`, a file is a unit of work, see `lait.crawler.units`); reports in input
    order. Holds the work directory's lock while it runs (see `lait.lock`)."""
    work = WorkDir(work_root).init()
    with locked(work, "lait ingest-warc"):
        return _ingest_all(paths, work, opts or IngestOptions(), workers=workers, show_progress=show_progress,
                           executor=executor, ray_address=ray_address)


def _ingest_all(paths: list[str | Path], work: WorkDir, opts: IngestOptions, *, workers: int,
                show_progress: bool, executor: str = "local", ray_address: str | None = None) -> list[FileReport]:
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from lait import lifeline
    from lait.log import progress

    work.clean_temp()
    paths = [str(p) for p in paths]
    # The same file named twice would race on its own parts.
    unique = list(dict.fromkeys(archive_inputs.identity(p) for p in paths))
    sizes = {p: archive_inputs.size(p) for p in unique}
    bar = progress(total=sum(sizes.values()), desc=STAGE, unit="B", unit_scale=True, disable=not show_progress)
    reports: dict[str, FileReport] = {}
    try:
        if executor == "ray":
            from lait.ray_executor import ray_map

            # The lock is this process's: each task writes on its behalf (a file's parts and marker).
            for i, out in ray_map(_ingest_unit, [(p, work.url, opts) for p in unique], address=ray_address):
                p = unique[i]
                reports[p] = out if isinstance(out, FileReport) else \
                    FileReport(p, file_tag(p), failed=f"{type(out).__name__}: {out}")
                bar.update(sizes[p])
            work.clean_temp()  # parts left open by a task whose node died
        elif workers <= 1 or len(unique) <= 1:
            for p in unique:
                reports[p] = ingest_file(p, work.url, opts)
                bar.update(sizes[p])
        else:
            with ProcessPoolExecutor(min(workers, len(unique)), **lifeline.pool_kwargs()) as pool:
                futures = {pool.submit(ingest_file, p, work.url, opts): p for p in unique}
                for fut in as_completed(futures):
                    p = futures[fut]
                    try:
                        reports[p] = fut.result()
                    except Exception as exc:  # the worker died (killed, out of memory)
                        reports[p] = FileReport(p, file_tag(p), failed=f"{type(exc).__name__}: {exc}")
                    bar.update(sizes[p])
    finally:
        bar.close()
    return [reports[p] for p in unique]
