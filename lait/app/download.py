"""`lait download LIST... --out WORK`: stage 1 from URL lists (img2dataset's input)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from dataclasses import dataclass

from lait.app.commands import add_config_command
from lait.config import ConfigError, setting
from lait.crawler.config import FetchConfig, RetrySettings, UnitsConfig
from lait.reasons import fetch_errors_help, reasons_help

log = logging.getLogger(__name__)

EPILOG = f"""\
what it writes (the tables a crawl writes, so `lait run WORK` goes on from here):
  url_list/     the list rows with a usable URL, once per URL: image_url, caption, page_url,
                extra (the --save-additional-columns as JSON), list_file, row
  images/       one row per image URL, fetched by the crawler's fetcher with all of its rules
                (robots.txt of every host, TDMRep, noai, the address guard, per-host limits,
                a host that keeps failing marked down); page_url is the list's page column
  rejected/     every other row with its reason, see below

Stage 3 (`lait clean`) makes each row's caption a candidate text with source `list`, so a
sample's caption is the list's caption when it passes the text rules and scoring. Every row
ends as a sample or in rejected/ with a reason (download/..., crawl/..., then filter/...,
clean/..., build/... after `lait run`).

{fetch_errors_help()}

{reasons_help(["download", "crawl"])}

formats: csv, tsv (a header row names the columns), jsonl (one JSON object a line), parquet,
txt (one URL a line); compressed .gz, .bz2, .xz; local paths, s3://... URLs and globs of
either. --input-format auto tells them apart by suffix. Text lists are read as --encoding
(UTF-8 unless given): a byte that is not text in it stops the command with one line naming the
file, the byte offset and the line, before that list's rows are kept; --encoding-errors replace
reads such bytes as U+FFFD instead and the summary counts them.

reruns: each list writes parts tagged with its path and a marker in WORK/_done/download/; a list
already read is skipped (--force reads it again), and images already in images/ are not fetched
again, so the same command resumes an interrupted download. Ctrl-C (or SIGTERM) stops cleanly,
keeping what was fetched, and exits 130 (143 for SIGTERM).

examples:
  lait download urls.csv --out work/ --caption-col caption
  lait download 's3://bucket/laion/*.parquet' --out work/ --url-col URL --caption-col TEXT \\
      --save-additional-columns NSFW similarity --concurrency 64
  lait download 's3://bucket/laion/*.parquet' --out s3://bucket/work/ --executor ray \\
      --ray-address auto --concurrency 64        # 64 per Ray task, one task per CPU
  lait run work/
"""


@dataclass
class DownloadConfig(UnitsConfig, FetchConfig, RetrySettings):
    """Settings of `lait download`: the list's columns, then the fetcher's settings."""

    section = "download"

    lists: list[str] = setting([], "URL lists: files, s3:// URLs or globs (csv, tsv, jsonl, parquet, txt)",
                               positional=True, nargs="+")
    input_format: str = setting("auto", "format of the lists (auto: by file suffix)",
                                choices=["auto", "txt", "csv", "tsv", "jsonl", "parquet"])
    url_col: str = setting("url", "column holding the image URL")
    caption_col: str = setting("caption", "column holding the caption ('' for lists without one)")
    page_col: str = setting("", "column holding the URL of the page the image was found on (optional)")
    save_additional_columns: list[str] = setting([], "more columns to keep with each row (url_list/ extra)",
                                                 metavar="COLUMN")
    encoding: str = setting("utf-8", "text encoding of csv, tsv, jsonl and txt lists (latin-1, cp1252, ...; "
                            "a UTF-8 byte-order mark is skipped)")
    encoding_errors: str = setting("strict", "bytes that are not text in --encoding: strict stops with one line "
                                   "naming the file, byte offset and line; replace reads each as U+FFFD and "
                                   "counts them in the summary", choices=["strict", "replace"])
    n_partitions: int = setting(0, "partitions of a new work directory (0: 16)")
    processes: int = setting(0, "fetcher processes side by side (0: one per CPU core, at most 4); the "
                             "hosts are split among them and --concurrency with them")
    fetch: bool = setting(True, "fetch the images (--no-fetch: only read the lists)")
    force: bool = setting(False, "read lists again that were read before")
    progress: bool = setting(True, "show a progress bar on a terminal")

    def validate(self) -> None:
        if not self.lists:
            raise ConfigError("no URL list given")
        self.validate_fetch()
        self.validate_retry()
        if not self.url_col:
            raise ConfigError("--url-col must name a column")
        from lait.crawler.url_list import check_encoding

        check_encoding(self.encoding)
        if self.n_partitions < 0 or self.processes < 0:
            raise ConfigError("n_partitions and processes must be >= 0")
        from lait.build.sample import KEYS, REASON

        # They reach every sample's JSON beside its own fields (img2dataset refuses these too).
        clash = sorted(set(self.save_additional_columns) & {*KEYS, REASON})
        if clash:
            raise ConfigError(f"--save-additional-columns {', '.join(clash)}: named like fields of a shard sample; "
                              f"these names are taken: {', '.join(KEYS + [REASON])}")


def summary(reports, stats: dict | None) -> str:
    """What the lists held and what became of their images, in a few lines."""
    rows = sum(r.rows for r in reports)
    kept = sum(r.kept for r in reports)
    rejected: Counter[str] = Counter()
    for r in reports:
        rejected.update(r.rejected)
    skipped = sum(r.skipped for r in reports)
    replaced = sum(r.replaced for r in reports)
    lines = [f"lists: {len(reports)} ({skipped} read before); rows read now: {rows}, kept: {kept}"
             + "".join(f", {k}: {v}" for k, v in sorted(rejected.items()))
             + (f", undecodable bytes read as U+FFFD (--encoding-errors replace): {replaced}" if replaced else "")]
    if stats is not None:
        crawl = {k: v for k, v in sorted(stats.items()) if k.startswith("crawl/")}
        lines.append("images: " + json.dumps(crawl, sort_keys=True))
        lines.append(f"finish: {stats.get('finish_reason')} after {stats.get('elapsed_time_seconds', 0):.1f} s")
    return "\n".join(lines)


def run(cfg: DownloadConfig) -> int:
    from lait.crawler.config import ImageFetchConfig
    from lait.crawler.run import crawl_stopped, crawl_succeeded, default_processes, fetch_images, stopped_status
    from lait.crawler.url_list import ListOptions, check_not_empty, expand_lists, list_format, read_lists
    from lait.drivers import open_work_dir
    from lait.lock import locked

    paths = expand_lists(cfg.lists)
    opts = ListOptions(input_format=cfg.input_format, url_col=cfg.url_col, caption_col=cfg.caption_col,
                       page_col=cfg.page_col, extra_cols=list(cfg.save_additional_columns), force=cfg.force,
                       allow_loopback=cfg.allow_loopback, allow_private=cfg.allow_private,
                       encoding=cfg.encoding, encoding_errors=cfg.encoding_errors)
    for p in paths:
        # An unknown suffix, a file that is not of its format, a missing or non-text caption column,
        # a first line that is not text in --encoding or an empty list fails before the work
        # directory is made.
        check_not_empty(p, list_format(p, cfg.input_format), opts.columns(), opts.text_columns(), opts.decoding())
    work = open_work_dir(cfg.out, create=True, n_partitions=cfg.n_partitions or None)
    with locked(work, "lait download"):
        work.write_config("download", cfg.to_yaml())
        reports = read_lists(paths, work, opts, show_progress=cfg.progress)
        stats = None
        if cfg.fetch:
            fetch = ImageFetchConfig(**cfg.fetch_settings(), tables=["url_list"])
            fetch.out = work.url
            stats = fetch_images(fetch, processes=default_processes(cfg.processes), executor=cfg.executor,
                                 ray_address=cfg.ray_address, show_progress=cfg.progress)
            if cfg.retry_failed and crawl_succeeded(stats.get("finish_reason")):
                stats = _retry_failed(cfg, work, fetch, stats)
    print(summary(reports, stats), file=sys.stderr)
    if stats is None:
        return 0
    reason = stats.get("finish_reason")
    if crawl_stopped(reason):
        print(f"lait download: stopped; run the same command again to resume ({work.url})", file=sys.stderr)
        return stopped_status(stats)
    return 0 if crawl_succeeded(reason) else 1


def _retry_failed(cfg, work, fetch, stats: dict) -> dict:
    """--retry-failed: passes over the transient failures (`lait.crawler.retry`)."""
    from lait.crawler.retry import retry_fetch
    from lait.crawler.run import default_processes

    return retry_fetch(cfg, work, fetch, stats, processes=default_processes(cfg.processes), command="lait download")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `lait download` to the `lait` command."""
    add_config_command(sub, "download", DownloadConfig, run,
                       help="stage 1 from URL lists (img2dataset's input): images with their captions",
                       description="Read URL lists (CSV, TSV, JSON lines, Parquet, text; local or object "
                                   "storage) into url_list/, and fetch their images into images/ with the "
                                   "crawler's fetcher, resumable.",
                       epilog=EPILOG)
