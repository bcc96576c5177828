"""`crawl(cfg)`: the `lait` spider in a subprocess (settings: `lait.crawler.config.CrawlConfig`).

Twisted's reactor runs once per process, so callers (`lait crawl`, `lait demo`, tests) never
start it themselves: `crawl(cfg)` writes the resolved config into the work directory and runs
``python -m lait.crawler.run CONFIG.yaml`` (this module's `main`), which starts Scrapy with the
project settings (`lait.crawler.settings`) and the `lait` spider.

Stopping: the first SIGINT (Ctrl-C) or SIGTERM stops the crawl cleanly: the downloads in
flight are cancelled (their requests go back to the queue), what was fetched is committed,
one line says how to resume, and the stats name the signal (`lait/stop_signal`), from which
the command exits 128 + its number, 130 or 143, as a shell reports a command a signal ended
(`stopped_status`): a script tells an interrupted crawl from a finished one. A second signal
stops it at once (exit 1; the rows of open parts are lost, as after a kill, and a resume
fetches them again). The
crawler runs in its own session, so a Ctrl-C on a terminal reaches `crawl`'s process only,
which passes it on once. A `crawl` process that is killed takes its crawlers with it
(`lait.lifeline`); they hold the work directory's lock with it until they are gone.

The same spider runs from the repository root as ``scrapy crawl lait -a seeds=seeds.txt -a
out=work/`` (any `CrawlConfig` field can be given with `-a NAME=VALUE`, lists comma-separated,
or `-a config=crawl.yaml`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from lait import errors, lifeline
from lait.config import ConfigError
from lait.crawler.config import CrawlConfig, FetchConfig, ImageFetchConfig, scrapy_settings
from lait.lock import child_env, lock_fds
from lait.startup import skip_pandas_probe

log = logging.getLogger(__name__)


# Finish reasons of a crawl that stopped where it was asked to: done, --max-pages, or one of
# Scrapy's CloseSpider limits a user set (CLOSESPIDER_TIMEOUT, _ITEMCOUNT, _PAGECOUNT).
SUCCESS_REASONS = frozenset({"finished", "max_pages", "closespider_timeout", "closespider_itemcount",
                             "closespider_pagecount"})


# The finish reason of a crawl stopped by SIGINT/SIGTERM (Scrapy's): cleanly, resumable.
STOPPED_REASON = "shutdown"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def crawl_succeeded(reason: str | None) -> bool:
    return reason in SUCCESS_REASONS


STOP_SIGNAL_KEY = "lait/stop_signal"


def crawl_stopped(reason: str | None) -> bool:
    """Whether a crawl was stopped cleanly on request (Ctrl-C, SIGTERM): what it fetched is
    kept and the same command resumes it; the command exits `stopped_status(stats)`."""
    return reason == STOPPED_REASON


def stopped_status(stats: dict[str, Any]) -> int:
    """The exit status of a command whose fetch was stopped by a signal: 128 + the signal's
    number (130 for SIGINT, 143 for SIGTERM), as a shell reports a command the signal ended
    and `lait filter` exits; SIGINT's when the stats do not say."""
    return 128 + int(stats.get(STOP_SIGNAL_KEY) or signal.SIGINT)


def crawl(cfg: CrawlConfig, *, timeout: float | None = None, quiet: bool = False) -> dict[str, Any]:
    """Run the crawl in a subprocess; returns its stats (Scrapy's and `crawl/*` counters).

    Raises RuntimeError when the crawler process fails.
    """
    from lait.drivers import open_work_dir
    from lait.lock import locked

    cfg.validate()
    cfg.seed_urls()  # fail here, not in the subprocess, on bad seeds
    work = open_work_dir(cfg.out, create=True, n_partitions=cfg.n_partitions or None)
    # Crawlers sharing one Redis frontier (one per machine) are one crawl: the lock is shared.
    with locked(work, "lait crawl", shared=bool(cfg.redis_url)):
        if not cfg.redis_url:  # crawlers sharing a Redis frontier may be writing right now
            work.clean_temp()  # parts a killed crawl left unfinished
        work.write_config("crawl", cfg.to_yaml())
        return _crawl_subprocesses([cfg], work, timeout=timeout, quiet=quiet)[0]


def fetch_images(cfg: ImageFetchConfig, *, processes: int = 1, timeout: float | None = None,
                 quiet: bool = False, executor: str = "local", ray_address: str | None = None,
                 show_progress: bool = False) -> dict[str, Any]:
    """Fetch the images the work directory's `cfg.tables` reference and `images/` lacks, with
    the crawl's fetcher (the `lait-images` spider), in units of host buckets
    (`lait.crawler.units`); returns their stats, added up (`merge_stats`).

    Local: `processes` units side by side, one subprocess each, splitting `cfg.concurrency`.
    Ray (`executor="ray"`): several units per task slot of the cluster at `ray_address` (a
    local one when None), each with the whole `cfg.concurrency`. Each host's requests,
    robots.txt, TDMRep and health stay in one unit. The caller holds the work directory's lock
    (`lait download`, `lait ingest-warc`)."""
    from lait.crawler import units
    from lait.workdir import WorkDir

    cfg.validate()
    work = WorkDir(cfg.out)
    work.clean_temp()
    if executor == "ray":
        return merge_stats(_fetch_on_ray(cfg, address=ray_address, show_progress=show_progress))
    if executor != "local":
        raise ConfigError(f"executor: expected local or ray, got {executor!r}")
    n = max(1, processes)
    shares = [cfg]
    if n > 1:
        planned = units.plan_units(units.pending_by_bucket(work, cfg.tables), n)
        shares = units.unit_configs(cfg, planned, split_concurrency=True) if len(planned) > 1 else [cfg]
    return merge_stats(_crawl_subprocesses(shares, work, timeout=timeout, quiet=quiet, spider="images"))


def fetch_unit(settings: dict[str, Any]) -> dict[str, Any]:
    """A Ray task: fetch one unit's images with a `lait-images` spider in a subprocess of this
    worker (which dies with it); its stats. The driver holds the work directory's lock and the
    spider writes on its behalf (`lait.lock.child_env`)."""
    from lait.workdir import WorkDir

    cfg = ImageFetchConfig.from_dict(settings, where="unit")
    return _crawl_subprocesses([cfg], WorkDir(cfg.out), timeout=None, quiet=False, spider="images")[0]


def _fetch_on_ray(cfg: ImageFetchConfig, *, address: str | None = None, retries: int = 3,
                 task_cpus: float = 1.0, show_progress: bool = True) -> list[dict[str, Any]]:
    """Fetch the pending images of `cfg.out` as units on a Ray cluster; each unit's stats (a
    unit that failed after its retries has `finish_reason` `unit_failed` and its error)."""
    from lait.crawler.units import UNITS_PER_SLOT, pending_by_bucket, plan_units, unit_configs
    from lait.log import progress
    from lait.ray_executor import ray_map, ray_task_slots
    from lait.workdir import WorkDir

    work = WorkDir(cfg.out)
    counts = pending_by_bucket(work, cfg.tables)
    total = sum(counts.values())
    slots = ray_task_slots(address, task_cpus)
    units = plan_units(counts, UNITS_PER_SLOT * slots)
    cfgs = unit_configs(cfg, units, split_concurrency=False)
    log.info("%d images to fetch in %d units on %d Ray task slots", total, len(cfgs), slots)
    if not total:
        return [{"finish_reason": "finished", "crawl/images_pending": 0}]
    results: list[dict[str, Any]] = []
    bar = progress(total=total, desc="download", unit="img", disable=not show_progress)
    start = time.monotonic()
    try:
        for i, out in ray_map(fetch_unit, [(c.to_dict(),) for c in cfgs], address=address, retries=retries,
                              num_cpus=task_cpus):
            if isinstance(out, BaseException):
                stop = errors.stop_error(out)
                if stop is not None:  # a full disk: every other unit would fail too
                    raise stop from out
                log.error("unit %d of %d (%d buckets) failed: %s", i + 1, len(cfgs), len(units[i]), out)
                out = {"finish_reason": "unit_failed", "lait/unit_error": f"{type(out).__name__}: {out}"}
            results.append(out)
            bar.update(out.get("crawl/rows_images", 0) + out.get("crawl/rows_rejected", 0))
            bar.set_postfix_str(f"{len(results)}/{len(cfgs)} units")
    finally:
        bar.close()
    log.info("%d units done in %.1f s", len(results), time.monotonic() - start)
    work.clean_temp()  # parts left open by a spider whose node died
    return results


def default_processes(processes: int) -> int:
    """Fetcher processes for a `processes` setting: itself, or for 0 one per CPU core, at most 4."""
    return processes if processes > 0 else max(1, min(4, os.cpu_count() or 1))


def merge_stats(all_stats: list[dict[str, Any]]) -> dict[str, Any]:
    """The stats of crawler processes that worked side by side, as one: counters added up,
    the longest elapsed time and peak memory, and the finish reason that matters most (a
    failure, else a stop, else the first)."""
    if len(all_stats) == 1:
        return all_stats[0]
    out: dict[str, Any] = {}
    for stats in all_stats:
        for key, value in stats.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if key in ("elapsed_time_seconds", "lait/retry_after_until", STOP_SIGNAL_KEY) or key.startswith("memusage/"):
                out[key] = max(out.get(key, 0), value)
            else:
                out[key] = out.get(key, 0) + value
    reasons = [s.get("finish_reason") for s in all_stats]
    out["finish_reason"] = (next((r for r in reasons if not (crawl_succeeded(r) or crawl_stopped(r))), None)
                            or next((r for r in reasons if crawl_stopped(r)), None) or reasons[0])
    return out


def _crawl_subprocesses(cfgs: list[FetchConfig], work: Any, *, timeout: float | None, quiet: bool,
                        spider: str = "lait") -> list[dict[str, Any]]:
    # The subprocess's config and stats are local files even when the work directory is remote
    # (as Scrapy's JOBDIR is); it inherits this environment, storage settings included, and the
    # right to write into the work directory whose lock this process holds.
    _remove_orphan_temp()
    with tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-") as tmp:
        cmds, stats_paths = [], []
        for i, cfg in enumerate(cfgs):
            config_path, stats_path = Path(tmp) / f"crawl-{i}.yaml", Path(tmp) / f"stats-{i}.json"
            config_path.write_text(cfg.to_yaml())
            cmds.append([sys.executable, "-m", "lait.crawler.run", str(config_path), "--stats-json",
                         str(stats_path), "--spider", spider])
            stats_paths.append(stats_path)
        env = lifeline.child_env(child_env(work))
        repo = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
        if isinstance(cfgs[0], CrawlConfig):
            log.info("crawling %d seed(s) into %s", len(cfgs[0].seed_urls()), work.url)
        returncodes = _run_crawlers(cmds, env, timeout, quiet)
        texts = [p.read_text() if p.exists() else "" for p in stats_paths]
        stats = [json.loads(t) if t.strip() else {} for t in texts]
        stop = next((s["lait/stop"] for s in stats if s.get("lait/stop")), None)
        if stop:  # a full disk: one line, exit 1 (lait.app.cli)
            raise errors.OutOfSpace(stop)
        failed = [rc for rc in returncodes if rc != 0]
        if failed:
            raise RuntimeError(f"crawler process exited with status {failed[0]}")
        return stats


TEMP_PREFIX = "lait-crawl-"


def _remove_orphan_temp() -> None:
    """Remove the temporary folders (configs, stats) of `crawl` processes that were killed:
    ``lait-crawl-<pid>-*`` whose pid no longer runs."""
    import shutil

    root = Path(tempfile.gettempdir())
    for path in root.glob(f"{TEMP_PREFIX}*-*"):
        pid = path.name[len(TEMP_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not lifeline.alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _run_crawlers(cmds: list[list[str]], env: dict, timeout: float | None, quiet: bool) -> list[int]:
    """Run crawler processes side by side, each in its own session, passing SIGINT/SIGTERM on
    to every one; their exit statuses. Each holds the work directory's lock with this process
    (its descriptor is passed on) and dies with it."""
    out = subprocess.DEVNULL if quiet else None
    procs = [subprocess.Popen(cmd, env=env, stdout=out, stderr=out, start_new_session=True,
                              pass_fds=lock_fds()) for cmd in cmds]
    previous = {}
    if threading.current_thread() is threading.main_thread():
        def forward(signum, frame):
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        return [proc.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
                for proc in procs]
    except BaseException:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Stopper:
    """The crawler process's SIGINT/SIGTERM handler: a clean stop, then a forced one."""

    def __init__(self, process, crawler):
        self.process = process
        self.crawler = crawler
        self.signals = 0

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        from twisted.internet import reactor

        self.signals += 1
        # Nothing but scheduling here: the interrupted code may hold the logging stream.
        reactor.callFromThread(self._stop if self.signals == 1 else self._force, signum)

    def _stop(self, signum) -> None:
        log.warning("received %s: stopping cleanly, what was fetched is kept (again to stop at once)",
                    signal.Signals(signum).name)
        if self.crawler.stats is not None:  # the command's exit status (`stopped_status`)
            self.crawler.stats.set_value(STOP_SIGNAL_KEY, int(signum))
        spider = self.crawler.spider
        if spider is not None and hasattr(spider, "interrupt"):
            spider.interrupt()
        self.process.stop()

    def _force(self, signum) -> None:
        from twisted.internet import reactor

        log.warning("received %s again: stopping at once; the rows of open parts are lost",
                    signal.Signals(signum).name)
        if reactor.running:
            reactor.stop()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the crawler subprocess: `python -m lait.crawler.run CONFIG.yaml`."""
    parser = argparse.ArgumentParser(prog="python -m lait.crawler.run", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="CrawlConfig YAML")
    parser.add_argument("--stats-json", help="write the final crawl stats here")
    parser.add_argument("--spider", choices=["lait", "images"], default="lait",
                        help="lait: a crawl (CrawlConfig); images: the images a work directory "
                             "references (ImageFetchConfig)")
    args = parser.parse_args(argv)
    lifeline.die_with_parent()  # a killed `lait crawl` takes its crawlers with it
    skip_pandas_probe()  # a fetcher sees no pandas objects: see lait.startup
    os.environ.setdefault("SCRAPY_SETTINGS_MODULE", "lait.crawler.settings")
    from scrapy.crawler import CrawlerProcess
    from scrapy.utils.project import get_project_settings

    from lait.crawler.spiders.images import ImageSpider
    from lait.crawler.spiders.lait import LaitSpider

    spider_cls, config_cls = (ImageSpider, ImageFetchConfig) if args.spider == "images" else (LaitSpider, CrawlConfig)
    try:
        cfg = config_cls.from_dict(config_cls.load_yaml(args.config), where=args.config)
        cfg.validate()
    except ConfigError as exc:
        print(f"crawler: {exc}", file=sys.stderr)
        return 2
    settings = get_project_settings()
    # The process-wide parts (logging, DNS resolver) read these before the spider applies them.
    settings.setdict(scrapy_settings(cfg), priority="spider")
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(spider_cls)
    # A dict: under `python -m`, this module's CrawlConfig is not the spider's class.
    process.crawl(crawler, config=cfg.to_dict(), stats_json=args.stats_json)
    stopper = _Stopper(process, crawler)
    stopper.install()
    process.start(install_signal_handlers=False)
    reason = crawler.stats.get_value("finish_reason") if crawler.stats else None
    if crawl_stopped(reason) and stopper.signals == 1:
        return 0
    return 0 if crawl_succeeded(reason) else 1


if __name__ == "__main__":
    sys.exit(main())
