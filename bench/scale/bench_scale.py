"""Benchmark: how lait behaves as the crawl grows — peak memory and time per page, per stage.

For each size (default 2,000 and 20,000 articles) the built-in local web is generated and served
from this process on loopback, then every stage runs as its own CLI process, as a user runs them:

    lait crawl   (stage 1, Scrapy spider, pages + images)
    lait filter  (stage 2)      lait clean (stage 3)
    lait score   (stage 4, the offline demo scorer)      lait build (stage 5, shards)

While a stage runs, its whole process tree (the command and its worker processes) is sampled
every 0.1 s; the peak of the tree's summed proportional set size (PSS: shared pages counted once
across forked workers) is that stage's peak memory. Time per page is the stage's wall time over
the pages the crawl saved. Both sizes run with the same settings (16 partitions, the same
workers, 1,000 samples a shard), one after the other, so the ratios compare like with like.

    .venv/bin/python bench/scale/bench_scale.py [--sizes 2000 20000] [--workers 2] [--json out.json]
    .venv/bin/python bench/scale/bench_scale.py --keep /tmp/scale   # keep the work dirs; a rerun
                                        # with the same --keep reuses their crawls (stages 2-5 redone)

Targets (issue 8): at the larger size, peak memory <= 1.3x and time per page <= 1.2x the
smaller size's, for every stage.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

STAGES = ("crawl", "filter", "clean", "score", "build")


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _tree_memory(proc) -> tuple[int, int]:
    """(summed PSS of a process and its descendants, largest single RSS), in bytes."""
    import psutil

    total, largest = 0, 0
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0, 0
    for p in procs:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        total += getattr(info, "pss", info.rss)
        largest = max(largest, info.rss)
    return total, largest


def run_measured(cmd: list[str], log_path: Path, interval: float = 0.1) -> dict:
    """Run a command to completion, sampling its process tree's memory; raise if it fails."""
    import psutil

    start = time.perf_counter()
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT)
        proc = psutil.Process(popen.pid)
        peak_tree, peak_single, samples = 0, 0, 0
        while popen.poll() is None:
            tree, single = _tree_memory(proc)
            peak_tree, peak_single = max(peak_tree, tree), max(peak_single, single)
            samples += 1
            time.sleep(interval)
    seconds = time.perf_counter() - start
    if popen.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {popen.returncode}:\n{tail}")
    return {"seconds": seconds, "peak_tree_bytes": peak_tree, "peak_process_bytes": peak_single,
            "samples": samples}


def lait(*args: str) -> list[str]:
    return [sys.executable, "-m", "lait", *args]


CRAWL_RESULT = "bench_crawl.json"  # in the work dir: the crawl finished, with its figures
CRAWL_TABLES = ("pages", "images")


def reset_to_crawl(work: Path) -> None:
    """Remove everything stages 2-5 wrote, keeping the crawl's tables and rejects."""
    import shutil

    for entry in work.iterdir():
        if entry.is_dir() and entry.name not in (*CRAWL_TABLES, "rejected", "_configs"):
            shutil.rmtree(entry)
    for part in (work / "rejected").iterdir():
        if not part.name.split("-", 1)[1].startswith("crawl"):
            part.unlink()


def run_size(pages: int, workers: int, root: Path, seed: int, stages: list[str]) -> dict:
    from lait.testkit.generator import generate_site
    from lait.testkit.server import SiteServer
    from lait.workdir import WorkDir

    work = root / f"work-{pages}"
    logs = root / f"logs-{pages}"
    logs.mkdir(parents=True, exist_ok=True)
    common = ["--workers", str(workers), "--no-progress"]
    results: dict[str, dict] = {}
    if (work / CRAWL_RESULT).exists():
        results["crawl"] = json.loads((work / CRAWL_RESULT).read_text())
        reset_to_crawl(work)
        print(f"[{pages}] reusing the crawl in {work}", file=sys.stderr, flush=True)
    else:
        if work.exists():
            import shutil

            shutil.rmtree(work)  # an unfinished crawl: start over
        site = generate_site(pages, seed=seed)
        with SiteServer(site) as srv:
            print(f"[{pages}] local web at {srv.url}", file=sys.stderr, flush=True)
            results["crawl"] = run_measured(
                lait("crawl", "--seeds", srv.url + "/", "--out", str(work), "--allow-loopback",
                     "--no-autothrottle", "--concurrency", "16", "--per-domain", "16",
                     "--log-level", "WARNING"), logs / "crawl.log")
        (work / CRAWL_RESULT).write_text(json.dumps(results["crawl"]))
    w = WorkDir(work)
    n_pages, n_images = w.count("pages"), w.count("images")
    print(f"[{pages}] crawl: {n_pages} pages, {n_images} images, {results['crawl']['seconds']:.0f} s",
          file=sys.stderr, flush=True)
    stage_cmds = {
        "filter": lait("filter", str(work), *common),
        "clean": lait("clean", str(work), "--languages", "en", "de", "fr", *common),
        # One scoring process using every core (the stage's own default); the demo scorer.
        "score": lait("score", str(work), "--model", "demo", "--near-dup-threshold", "0.999", "--no-progress"),
        # 1,000 samples a shard at both sizes: with the default 10,000 the smaller crawl makes one
        # shard, written inline by the command process, and the larger several written by the
        # worker pool, so the two figures would compare one process with three.
        "build": lait("build", str(work), "--samples-per-shard", "1000", *common),
    }
    for name, cmd in stage_cmds.items():
        if name not in stages:
            break  # every stage needs the one before it
        results[name] = run_measured(cmd, logs / f"{name}.log")
        print(f"[{pages}] {name}: {results[name]['seconds']:.1f} s, peak "
              f"{results[name]['peak_tree_bytes'] / 2**20:.0f} MiB", file=sys.stderr, flush=True)
    tables = {t: w.count(t) for t in ("pages", "images", "images_ok", "candidates", "scored")}
    shards = json.loads((work / "shards" / "stats.json").read_text()) if (work / "shards" / "stats.json").exists() else {}
    return {"pages": n_pages, "site_articles": pages, "tables": tables,
            "samples": shards.get("samples"), "stages": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000], help="articles of the generated site")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of stages 2, 3 and 5")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", default=None, help="keep the work directories under this folder")
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--until", default="build", choices=STAGES[1:], help="last stage to run")
    args = parser.parse_args(argv)

    import psutil  # noqa: F401  (fail early, with the import error, if the bench extra is missing)

    from lait.testkit.demo_scorer import ensure_demo_model

    ensure_demo_model(None)  # built once per machine, outside the measurement
    root_ctx = tempfile.TemporaryDirectory() if args.keep is None else None
    root = Path(args.keep or root_ctx.name)
    out = {"sizes": {}, "workers": args.workers, "cpus": os.cpu_count()}
    try:
        for n in args.sizes:
            out["sizes"][n] = run_size(n, args.workers, root, args.seed,
                                       list(STAGES[:STAGES.index(args.until) + 1]))
    finally:
        if root_ctx is not None:
            root_ctx.cleanup()

    sizes = sorted(out["sizes"])
    print(f"\nbench/scale: local web, {args.workers} workers, {os.cpu_count()} CPUs; "
          f"memory = peak PSS of the stage's process tree")
    header = f"{'stage':<8}" + "".join(f"{f'{n} art. ms/page':>17}{'MiB':>7}" for n in sizes)
    if len(sizes) > 1:
        header += f"{'time ratio':>12}{'mem ratio':>11}"
    print(header)
    small, large = out["sizes"][sizes[0]], out["sizes"][sizes[-1]]
    ok = True
    for st in STAGES[:STAGES.index(args.until) + 1]:
        line = f"{st:<8}"
        for n in sizes:
            r = out["sizes"][n]
            line += f"{1000 * r['stages'][st]['seconds'] / r['pages']:>17.2f}{r['stages'][st]['peak_tree_bytes'] / 2**20:>7.0f}"
        if len(sizes) > 1:
            t = (large["stages"][st]["seconds"] / large["pages"]) / (small["stages"][st]["seconds"] / small["pages"])
            m = large["stages"][st]["peak_tree_bytes"] / small["stages"][st]["peak_tree_bytes"]
            ok &= t <= 1.2 and m <= 1.3
            line += f"{t:>12.2f}{m:>11.2f}"
        print(line)
    for n in sizes:
        r = out["sizes"][n]
        total = sum(s["seconds"] for s in r["stages"].values())  # the crawl's from its own run
        print(f"{n} articles: {r['pages']} pages saved, tables {r['tables']}, {r['samples']} samples, "
              f"{total:.0f} s in all ({1000 * total / r['pages']:.1f} ms/page)")
    if len(sizes) > 1:
        print(f"targets (time ratio <= 1.2, memory ratio <= 1.3 for every stage): {'met' if ok else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
