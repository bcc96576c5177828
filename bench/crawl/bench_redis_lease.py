"""Benchmark: what the Redis lease costs a shared crawl (`lait.crawler.lease`, issue 59).

The same `lait` crawler crawls the built-in local web through a real redis-server twice per
round, alternating: with lait's `LeasedScheduler` (every popped request written into the
crawler's hash, released in batches after commits) and with scrapy-redis's own `Scheduler`,
which loses a killed crawler's requests. Redis is emptied before every run. The figure is pages
per second over the whole crawl (images fetched too, idle wait of 1 s at the end in both), and
the crawler process's CPU time per page: the local web's pace bounds the first, so the second
is where the lease's Redis calls would show.

    .venv/bin/python bench/crawl/bench_redis_lease.py [--pages 200] [--repeats 3]

Prints the median of each and their ratio; the target is a ratio >= 0.95 (the lease costs at
most 5 %). Needs redis-server (scripts/system-deps.sh installs it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

TARGET = 0.95
PLAIN = "SCHEDULER=scrapy_redis.scheduler.Scheduler"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def crawl(seed: str, redis_url: str, tmp: Path, plain: bool) -> tuple[float, float]:
    """(pages per second, CPU milliseconds per page) of one crawl."""
    import resource

    from lait.crawler.config import CrawlConfig

    out = Path(tempfile.mkdtemp(dir=tmp))
    cfg = CrawlConfig(seeds=[seed], out=str(out / "work"), allow_loopback=True, autothrottle=False,
                      log_level="WARNING", concurrency=16, per_domain=16, redis_url=redis_url,
                      redis_key="bench", idle_seconds=1.0, scrapy_settings=[PLAIN] if plain else [])
    config = out / "crawl.yaml"
    config.write_text(cfg.to_yaml())
    stats = out / "stats.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "lait.crawler.run", str(config), "--stats-json", str(stats)], env=env,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    s = json.loads(stats.read_text())
    shutil.rmtree(out, ignore_errors=True)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return s["crawl/rows_pages"] / s["elapsed_time_seconds"], 1000 * cpu / s["crawl/rows_pages"]


def main() -> None:
    import redis

    from lait.testkit.generator import generate_site
    from lait.testkit.server import SiteServer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed (scripts/system-deps.sh installs it)")
    port = _free_port()
    tmp = Path(tempfile.mkdtemp(prefix="lait-bench-lease-"))
    server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp), "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    figures: dict[str, list[float]] = {"lease": [], "scrapy-redis": []}
    cpu: dict[str, list[float]] = {"lease": [], "scrapy-redis": []}
    try:
        with SiteServer(generate_site(args.pages, seed=5)) as site:
            for _ in range(args.repeats):
                for name, plain in (("lease", False), ("scrapy-redis", True)):
                    client.flushall()
                    rate, ms = crawl(site.url + "/", f"redis://127.0.0.1:{port}/0", tmp, plain)
                    figures[name].append(rate)
                    cpu[name].append(ms)
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    lease, plain = (statistics.median(figures[k]) for k in ("lease", "scrapy-redis"))
    runs = {k: ", ".join(f"{v:.1f}" for v in vs) for k, vs in figures.items()}
    print(f"pages/s, median of {args.repeats}: lease {lease:.1f} ({runs['lease']}), "
          f"scrapy-redis {plain:.1f} ({runs['scrapy-redis']})")
    print(f"ratio lease / scrapy-redis: {lease / plain:.3f} (target >= {TARGET})")
    ms = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"crawler CPU per page (process start included), median: lease {ms['lease']:.1f} ms, "
          f"scrapy-redis {ms['scrapy-redis']:.1f} ms, ratio {ms['lease'] / ms['scrapy-redis']:.3f}")


if __name__ == "__main__":
    main()
