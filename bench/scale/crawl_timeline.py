"""What the crawler process holds over time, on the built-in local web at several sizes.

`bench_scale.py` gives each stage's peak; this script shows where the crawl's peak comes from.
For each size it serves the generated site on loopback, runs `lait crawl` with the settings of
`bench_scale.py`, and samples the crawler process every 2 s from inside (`crawl_probe.py`): its
RSS beside the requests in Scrapy's scheduler, the fingerprints of its duplicate filter, the
links in lait's frontier, and the pages and images written so far.

    .venv/bin/python bench/scale/crawl_timeline.py                          # 2,000 and 20,000
    .venv/bin/python bench/scale/crawl_timeline.py --seconds 40 --json t.json   # the first 40 s

``--seconds`` stops each crawl early (Scrapy's CLOSESPIDER_TIMEOUT): the start of a crawl, when
the first listing pages are parsed, is where the sizes differ first.
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))


def crawl_timeline(pages: int, root: Path, seed: int, seconds: float) -> dict:
    from lait.testkit.generator import generate_site
    from lait.testkit.server import SiteServer

    work, probe = root / f"work-{pages}", root / f"probe-{pages}.jsonl"
    env = dict(os.environ, LAIT_CRAWL_PROBE=str(probe))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(HERE), env.get("PYTHONPATH")]))
    settings = ['EXTENSIONS={"crawl_probe.CrawlProbe": 900}']
    if seconds:
        settings.append(f"CLOSESPIDER_TIMEOUT={seconds}")
    site = generate_site(pages, seed=seed)
    with SiteServer(site) as srv:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "lait", "crawl", "--seeds", srv.url + "/", "--out", str(work),
                        "--allow-loopback", "--no-autothrottle", "--concurrency", "16", "--per-domain", "16",
                        "--log-level", "WARNING", "--scrapy-settings", *settings],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
    rows = [json.loads(line) for line in probe.read_text().splitlines() if line.strip()]
    return {"articles": pages, "seconds": wall, "rows": rows}


def _at(rows: list[dict], t: float) -> dict:
    """The last sample taken at or before `t` seconds."""
    before = [r for r in rows if r["t"] <= t]
    return before[-1] if before else rows[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000], help="articles of the generated site")
    parser.add_argument("--seconds", type=float, default=0, help="stop each crawl after this long (0: crawl it all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write every sample here")
    args = parser.parse_args(argv)

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            out[n] = crawl_timeline(n, Path(tmp), args.seed, args.seconds)
            print(f"[{n}] {len(out[n]['rows'])} samples over {out[n]['seconds']:.0f} s", file=sys.stderr, flush=True)

    print("\ncrawl_timeline: the crawler process, sampled from inside (RSS in MiB)")
    print(f"{'articles':>9}{'RSS at 10 s':>13}{'at 30 s':>9}{'peak RSS':>10}{'max scheduler':>15}"
          f"{'max frontier':>14}{'seen at end':>13}{'pages':>8}{'images':>8}")
    for n in args.sizes:
        rows = out[n]["rows"]
        last = rows[-1]
        frontier = [r["frontier"] for r in rows if r.get("frontier") is not None]
        print(f"{n:>9}{_at(rows, 10)['rss']:>13}{_at(rows, 30)['rss']:>9}{max(r['rss'] for r in rows):>10}"
              f"{max(r.get('scheduler') or 0 for r in rows):>15}{max(frontier) if frontier else '-':>14}"
              f"{last.get('seen') or '-':>13}{last['pages']:>8}{last['images']:>8}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
