"""Stage 3 over the real-web pages, printed as JSON lines: one candidate text per line.

Run by `bench_captions.py` once per version of the code: the checkout whose `lait` is imported
is the one first on `sys.path` (`--code DIR` puts it there), so the same script measures this
branch and main before it. Pages are the real-web mode's (`lait.testkit.realweb`): the real
pages of ../shared/data with their images made local and one planted COCO figure each.

    python bench/captions/run_clean.py --code CHECKOUT --out FILE [--pages PATHS_FILE] [--languages en]
        [--pages-dir DIR]

`--pages-dir` serves another directory of real pages (an `index.json` and its files, as
`unseen_pages.py` writes them) instead of ../shared/data/html.

Each line: {"page": PATH, "image": LOCAL IMAGE URL, "source": ..., "text": ..., "lang": ...}.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path

BASE = "http://127.0.0.1:8000"


def write_pages(work, site, paths: list[str]) -> list[int]:
    """The `pages/` table of a work directory: each path of the real-web `site` as fetched with
    status 200 from BASE, in the partition of its URL. Returns the partitions written."""
    from datetime import datetime, timezone

    from lait.workdir import partition_of

    by_part: dict[int, list[dict]] = {}
    now = datetime(2024, 5, 1, tzinfo=timezone.utc)
    ctype = "text/html; charset=utf-8"
    for path in paths:
        url = BASE + path
        by_part.setdefault(partition_of(url, work.n_partitions), []).append(
            {"url": url, "status": 200, "fetched_at": now, "headers": {"Content-Type": ctype},
             "content_type": ctype, "html": site.route(path).body, "encoding": None, "depth": 0,
             "referer": None, "error": None})
    for p, rows in by_part.items():
        w = work.writer("pages", p, "bench")
        w.write_many(rows)
        w.close()
    return sorted(by_part)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", required=True, help="checkout whose lait is run")
    ap.add_argument("--data", default=None, help="../shared/data (default: beside --code's parent)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--pages", default=None, help="file with the page paths to run (default: all)")
    ap.add_argument("--pages-dir", default=None, help="directory of other real pages (index.json)")
    ap.add_argument("--languages", default="en", help="comma-separated, or any")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="another CleanConfig setting, its value as JSON (repeatable)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(args.code).resolve()))
    logging.getLogger("trafilatura").setLevel(logging.ERROR)

    from datetime import datetime, timezone

    from lait.executor import LocalExecutor
    from lait.filters.text_stage import CleanConfig, CleanStage
    from lait.testkit.realweb import RealWebSite
    from lait.workdir import WorkDir, partition_of

    assert Path(sys.modules["lait"].__file__).resolve().is_relative_to(Path(args.code).resolve())
    site = RealWebSite(args.data, pages_dir=args.pages_dir) if args.pages_dir else RealWebSite(args.data)
    wanted = None
    if args.pages:
        wanted = set(Path(args.pages).read_text().split())
    paths = [p for p in site.page_paths() if p != "/" and (wanted is None or p in wanted)]
    tmp = Path(tempfile.mkdtemp(prefix="captions-clean-"))
    try:
        work = WorkDir(tmp / "work", n_partitions=4).init()
        write_pages(work, site, paths)
        languages = args.languages.split(",")
        extra = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
        cfg = CleanConfig(work=str(work.root), progress=False, languages=languages, **extra)
        report = LocalExecutor(workers=args.workers, show_progress=False).run(CleanStage(cfg), work)
        assert report.ok, report.summary()
        with open(args.out, "w", encoding="utf-8") as out:
            for r in sorted(work.iter_rows("candidates"), key=lambda r: (r["page_url"], r["image_url"])):
                for t in r["texts"]:
                    out.write(json.dumps({"page": r["page_url"][len(BASE):], "image": r["image_url"][len(BASE):],
                                          "source": t["source"], "text": t["text"], "lang": t["lang"]},
                                         ensure_ascii=False) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
