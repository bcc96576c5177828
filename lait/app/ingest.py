"""`lait ingest-warc FILES... --out WORK`: stage 1 from Common Crawl WARC/WAT archives."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

from lait.app.commands import add_config_command
from lait.config import ConfigError, setting
from lait.crawler.config import FetchConfig, RetrySettings, UnitsConfig
from lait.reasons import fetch_errors_help, reasons_help

log = logging.getLogger(__name__)

EPILOG = f"""\
what it writes (the same tables as `lait crawl`, partitioned the same way):
  pages/        HTML responses (html kept for 2xx; other statuses keep status and headers)
  images/       image responses (bytes and mime; bytes for 2xx only), then the images the
                archived pages reference and the archives do not hold, fetched by the
                crawler's fetcher with all of its rules (robots.txt of every host, TDMRep,
                noai, the address guard, host limits and host-down); --no-fetch-images skips that
  warc_links/   image references with alt/title: <img>/og:image of archived pages and the
                IMG@ links of WAT records (page_url, image_url, alt, title, source)
  rejected/     records not stored and damage notes, see below; requests never sent (crawl/...)

Record bodies are decoded (chunked, gzip, deflate, br) within the crawler's size limits
(--max-page-bytes, --max-image-bytes): a compression bomb stops there and is rejected as
ingest/body_too_large; the file's other records are kept. --resolve HOST:PORT:ADDRESS points
an archived host at a mirror (curl's --resolve), e.g. a local copy of its images.

{fetch_errors_help()}

{reasons_help(["ingest", "crawl"])}


damaged archives: the records readable before the damage are ingested, the damage is recorded
in rejected/ and in the summary, and the run goes on with the other files. The exit code is 0
when every file was processed, damaged or not (damage is a warning); 1 when lait itself failed
on a file, or with --strict when any archive was damaged; 2 for bad arguments.

reruns: each file writes parts tagged with its path and a marker in WORK/_done/ingest-warc/;
a finished, unchanged file is skipped, an interrupted or changed one is redone (--force redoes all).

inputs: local files; archive URLs (s3://..., https://...), each copied to a temporary local file
by the worker that reads it; Common Crawl path lists (warc.paths.gz, wat.paths.gz: one path a
line, under --base-url), which stand for the archives they list.

examples:
  lait ingest-warc CC-MAIN-*.warc.gz --out work/ --workers 8
  lait ingest-warc wat.paths.gz --out work/ --workers 8      # a crawl's WAT files, from data.commoncrawl.org
  lait ingest-warc CC-MAIN-*.warc.wat.gz --out work/      # references and alt texts only
  lait ingest-warc page.warc.gz --out work/ --resolve upload.wikimedia.org:443:10.0.0.7 --allow-private
  lait run work/                                           # stages 2-5 on what was ingested
"""


@dataclasses.dataclass
class WarcIngestConfig(UnitsConfig, FetchConfig, RetrySettings):
    """Settings of `lait ingest-warc`: the archives, then the fetcher's settings for the
    images their pages reference."""

    section = "ingest_warc"

    files: list[str] = setting([], "WARC/ARC/WAT files (.warc, .warc.gz, .arc, .arc.gz, .wat.gz): local "
                               "paths, archive URLs (s3://, https://) or Common Crawl path lists "
                               "(warc.paths.gz, wat.paths.gz)", positional=True, nargs="+")
    base_url: str = setting("https://data.commoncrawl.org/", "base URL of the relative paths of Common "
                            "Crawl path lists (s3://commoncrawl/ reads them through S3)")
    out: str = setting("", "work directory to create or add to")
    partitions: int | None = setting(None, "partition count of a new work directory (default 16)")
    workers: int = setting(0, "files read in parallel (0: one per CPU core)")
    links: bool = setting(True, "extract image references with alt/title from archived HTML into warc_links/")
    max_record_mb: int = setting(64, "skip (and record) records larger than this many MiB")
    check_gzip: bool = setting(True, "check that gzip members match records (one extra decompression)")
    force: bool = setting(False, "re-ingest files already ingested")
    fetch_images: bool = setting(True, "fetch the images archived pages reference that the archives do "
                                 "not hold, with the crawler's fetcher")
    fetch_processes: int = setting(0, "fetcher processes side by side (0: one per CPU core, at most 4); "
                                   "the hosts are split among them and --concurrency with them")
    strict: bool = setting(False, "exit 1 when any archive is damaged")
    progress: bool = setting(True, "show a progress bar on a terminal")

    def validate(self) -> None:
        if not self.files:
            raise ConfigError("no input files")
        if not self.out:
            raise ConfigError("--out WORK is required")
        from lait.crawler.archive_inputs import is_url

        missing = [f for f in self.files if not is_url(f) and not Path(f).is_file()]
        if missing:
            raise ConfigError(f"input files not found: {', '.join(missing[:5])}"
                              + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
        self.validate_fetch()
        self.validate_retry()
        if self.workers < 0 or self.fetch_processes < 0 or self.max_record_mb <= 0:
            raise ConfigError("workers and fetch-processes must be >= 0 and max-record-mb > 0")
        if self.partitions is not None and self.partitions <= 0:
            raise ConfigError("partitions must be > 0")


def format_summary(reports) -> str:
    """A table of files with records, pages, images, links, rejects and damage; then totals."""
    lines = [f"{'file':40} {'records':>8} {'pages':>6} {'images':>6} {'links':>6} {'rejected':>8}  status"]
    tot = dict.fromkeys(("records", "pages", "images", "links", "rejected"), 0)
    for r in reports:
        name = Path(r.path).name
        name = name if len(name) <= 40 else "..." + name[-37:]
        status = ("FAILED: " + r.failed if r.failed else "already ingested" if r.skipped
                  else f"{len(r.damage)} damage" if r.damage else "ok")
        lines.append(f"{name:40} {r.records:>8} {r.pages:>6} {r.images:>6} {r.links:>6} {r.rejected:>8}  {status}")
        for d in r.damage[:5]:
            lines.append(f"    {d[:150]}")
        if len(r.damage) > 5:
            lines.append(f"    ... and {len(r.damage) - 5} more")
        for k in tot:
            tot[k] += getattr(r, k)
    n_damaged = sum(1 for r in reports if r.damage)
    n_failed = sum(1 for r in reports if r.failed)
    lines.append(f"{'total: ' + str(len(reports)) + ' files':40} {tot['records']:>8} {tot['pages']:>6} "
                 f"{tot['images']:>6} {tot['links']:>6} {tot['rejected']:>8}  "
                 f"{n_damaged} damaged, {n_failed} failed")
    return "\n".join(lines)


def run(cfg: WarcIngestConfig) -> int:
    from lait.crawler.archive_inputs import expand_archives
    from lait.crawler.config import ImageFetchConfig
    from lait.crawler.run import crawl_stopped, crawl_succeeded, default_processes, fetch_images, stopped_status
    from lait.crawler.warc_ingest import IngestOptions, ingest_files
    from lait.drivers import open_work_dir
    from lait.lock import locked

    work = open_work_dir(cfg.out, create=True, n_partitions=cfg.partitions)
    opts = IngestOptions(links=cfg.links, max_record_bytes=cfg.max_record_mb << 20,
                         check_gzip=cfg.check_gzip, force=cfg.force, max_page_bytes=cfg.max_page_bytes,
                         max_image_bytes=cfg.max_image_bytes, obey_tdmrep=cfg.obey_tdmrep,
                         exclude_domains=os.path.abspath(cfg.exclude_domains) if cfg.exclude_domains else "",
                         exclude_urls=os.path.abspath(cfg.exclude_urls) if cfg.exclude_urls else "")
    stats = None
    with locked(work, "lait ingest-warc"):
        work.write_config("ingest-warc", cfg.to_yaml())
        reports = ingest_files(expand_archives(cfg.files, cfg.base_url), work.url, opts,
                               workers=cfg.workers or os.cpu_count() or 1, show_progress=cfg.progress,
                               executor=cfg.executor, ray_address=cfg.ray_address)
        print(format_summary(reports), file=sys.stderr)
        if cfg.fetch_images and cfg.links and work.partitions("warc_links"):
            fetch = ImageFetchConfig(**cfg.fetch_settings(), tables=["warc_links"])
            fetch.out = work.url
            stats = fetch_images(fetch, processes=default_processes(cfg.fetch_processes), executor=cfg.executor,
                                 ray_address=cfg.ray_address, show_progress=cfg.progress)
            if cfg.retry_failed and crawl_succeeded(stats.get("finish_reason")):
                stats = _retry_failed(cfg, work, fetch, stats)
            crawl = {k: v for k, v in sorted(stats.items()) if k.startswith("crawl/")}
            print("referenced images: " + json.dumps(crawl, sort_keys=True), file=sys.stderr)
    for r in reports:
        if r.damage:
            log.warning("%s: %d damage notes (recorded in rejected/ as ingest/...)", r.path, len(r.damage))
    if any(r.failed for r in reports):
        return 1
    if stats is not None and crawl_stopped(stats.get("finish_reason")):
        print(f"lait ingest-warc: stopped; run the same command again to resume ({work.url})", file=sys.stderr)
        return stopped_status(stats)
    if stats is not None and not crawl_succeeded(stats.get("finish_reason")):
        return 1
    if cfg.strict and any(r.damage for r in reports):
        return 1
    return 0


def _retry_failed(cfg, work, fetch, stats: dict) -> dict:
    """--retry-failed: passes over the transient failures (`lait.crawler.retry`)."""
    from lait.crawler.retry import retry_fetch
    from lait.crawler.run import default_processes

    return retry_fetch(cfg, work, fetch, stats, processes=default_processes(cfg.fetch_processes), command="lait ingest-warc")


def register(subparsers: argparse._SubParsersAction) -> None:
    add_config_command(
        subparsers, "ingest-warc", WarcIngestConfig, run,
        help="stage 1 from Common Crawl WARC/WAT archives into pages/, images/, warc_links/",
        description="Read WARC/ARC/WAT archives (streaming, FastWARC with a warcio fallback) into the "
                    "tables the crawler writes, several files in parallel, resumable per file.",
        epilog=EPILOG,
    )
