"""Stage 3 on sites never seen: junk among the kept texts and captions kept, on the fresh pages (issue 62).

Runs stage 3 over the real pages of ../shared/data/html/fresh at their own URLs (as a crawl of
those sites gives them to it: `pages/` rows with the page's bytes; no image is needed), with
its defaults but `languages: [any]` (the language is a user's choice, not a judgement of junk;
every fresh page counts), then reads the labelled texts of bench/captions/fresh_dev.json or
fresh_test.json (labels by the definitions in bench/captions/README.md) and prints, for the
split: how many labelled texts stage 3 kept of each label, the share of junk among the kept
(issue 62's bound: at most 8 %) and the share of caption-labelled texts kept (at least 85 %).

The test part is read once, at the end, with the defaults chosen on the development part:

    .venv/bin/python bench/captions/bench_fresh.py --split dev
    .venv/bin/python bench/captions/bench_fresh.py --split test

`--split unseen --unseen-pages DIR` gives the same two figures on an earlier labelled set,
unseen.json (trafilatura's evaluation pages, which no rule of `lait.filters.image_place` was
chosen on; README.md says how to get them), its `describes` counted as `caption`.

`--set KEY=JSON` passes another stage 3 setting (`--set 'caption_judge="none"'`: the rules
before issue 62).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
JUNK_BOUND = 0.08
CAPTION_BOUND = 0.85
LABELS = ("caption", "page", "junk")


def stage3_texts(pages: list[tuple[str, bytes]], settings: dict, workers: int = 2) -> list[tuple[str, str, str]]:
    """(page URL, image URL, text) of every text stage 3 keeps on `pages` ((URL, HTML bytes),
    as a crawl gives them to it: `pages/` rows fetched with status 200), with `settings` over its
    defaults but `languages: [any]` (the language is a user's choice, not a judgement of junk)."""
    from datetime import datetime, timezone

    from lait.executor import LocalExecutor
    from lait.filters.text_stage import CleanConfig, CleanStage
    from lait.workdir import WorkDir, partition_of

    now = datetime(2024, 5, 1, tzinfo=timezone.utc)
    ctype = "text/html; charset=utf-8"
    with tempfile.TemporaryDirectory(prefix="bench-fresh-") as tmp:
        work = WorkDir(Path(tmp) / "work", n_partitions=4).init()
        by_part: dict[int, list[dict]] = {}
        for url, html in pages:
            by_part.setdefault(partition_of(url, work.n_partitions), []).append(
                {"url": url, "status": 200, "fetched_at": now, "headers": {"Content-Type": ctype},
                 "content_type": ctype, "html": html, "encoding": None, "depth": 0, "referer": None, "error": None})
        for part, rows in by_part.items():
            w = work.writer("pages", part, "bench")
            w.write_many(rows)
            w.close()
        cfg = CleanConfig(work=str(work.root), progress=False, **{"languages": ["any"], **settings})
        cfg.validate()
        report = LocalExecutor(workers=workers, show_progress=False).run(CleanStage(cfg), work)
        if not report.ok:
            raise RuntimeError(report.summary())
        return [(r["page_url"], r["image_url"], t["text"]) for r in work.iter_rows("candidates") for t in r["texts"]]


def fresh_kept(data: Path, settings: dict, split: str | None = None, workers: int = 2) -> set[tuple[str, str]]:
    """(page id, text) of every text stage 3 keeps on the fresh pages (of `split`, or all),
    with `settings` over its defaults."""
    import gzip

    from fresh_pages import fresh_index

    ids: dict[str, str] = {}  # URL -> page id
    pages, seen = [], set()
    for p in fresh_index(data):
        if p["id"] not in seen and (split is None or p["split"] == split):
            seen.add(p["id"])
            url = p["url"] if "://" in p["url"] else f"https://fresh.invalid/{p['id']}.html"
            ids[url] = p["id"]
            pages.append((url, gzip.decompress(Path(p["path"]).read_bytes())))
    return {(ids[page], text) for page, _, text in stage3_texts(pages, settings, workers)}


def unseen_kept(data: Path, pages_dir: Path, settings: dict, workers: int = 2) -> set[tuple[str, str, str]]:
    """(page path, image path, text) of every text stage 3 keeps on the unseen pages
    (`unseen_pages.py`'s folder, as the real-web mode serves them and `unseen.json` names them),
    with `settings` over its defaults. Each page is read at the URL its site published it at (as
    a crawl of that site gives it to stage 3: its own links are its own, not another site's),
    with the real-web mode's local pictures."""
    from urllib.parse import urlsplit

    from run_clean import BASE

    from lait.testkit.realweb import RealWebSite

    site = RealWebSite(data, pages_dir=pages_dir)
    path_of: dict[str, str] = {}  # URL -> the real-web mode's path
    pages = []
    for path in site.page_paths():
        if path != "/":
            url = site.original(path)[1]
            url = url if url.startswith(("http://", "https://")) else BASE + path
            path_of[url] = path
            pages.append((url, site.route(path).body))
    return {(path_of[page], image[len(BASE):] if image.startswith(BASE) else urlsplit(image).path, text)
            for page, image, text in stage3_texts(pages, settings, workers)}


def unseen_rows() -> list[dict]:
    """unseen.json's rows in this benchmark's terms: `describes` is `caption` (its rules say
    the same: the text could be the picture's caption), the key (page, image, text)."""
    rows = json.loads((REPO / "bench" / "captions" / "unseen.json").read_text())["rows"]
    return [{**r, "label": "caption" if r["label"] == "describes" else r["label"],
             "page_id": (r["page"], r["image"])} for r in rows]


def figures(rows: list[dict], kept: set[tuple[str, str]]) -> dict:
    total = Counter(r["label"] for r in rows)
    held = Counter(r["label"] for r in rows if (r["page_id"], r["text"]) in kept)
    n_kept = sum(held.values())
    return {"labelled": dict(total), "kept": dict(held), "n_kept": n_kept,
            "junk_share": held["junk"] / n_kept if n_kept else 0.0,
            "caption_kept": held["caption"] / total["caption"] if total["caption"] else 0.0,
            "sites": len({r["site"] for r in rows})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--split", choices=["dev", "test", "unseen"], required=True,
                    help="unseen: unseen.json on trafilatura's evaluation pages (--unseen-pages)")
    ap.add_argument("--unseen-pages", default=None, help="unseen_pages.py's folder (README.md), for --split unseen")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    settings = {k: json.loads(v) for k, v in (a.split("=", 1) for a in args.set)}
    if args.split == "unseen":
        if not args.unseen_pages or not (Path(args.unseen_pages) / "index.json").is_file():
            sys.exit("--split unseen needs --unseen-pages DIR (bench/captions/README.md: unseen.json)")
        rows = unseen_rows()
        kept = {((p, i), t) for p, i, t in unseen_kept(Path(args.data), Path(args.unseen_pages), settings,
                                                      args.workers)}
        report(args.split, figures(rows, kept))
        return
    rows = json.loads((REPO / "bench" / "captions" / f"fresh_{args.split}.json").read_text())["rows"]
    unlabelled = [r for r in rows if r["label"] not in LABELS]
    if unlabelled:
        sys.exit(f"{len(unlabelled)} rows of fresh_{args.split}.json have no label")
    report(args.split, figures(rows, fresh_kept(Path(args.data), settings, args.split, args.workers)))


def report(split: str, f: dict) -> None:
    labelled = ", ".join(f"{k} {f['labelled'].get(k, 0)}" for k in LABELS)
    held = ", ".join(f"{k} {f['kept'].get(k, 0)}" for k in LABELS)
    name = "unseen.json" if split == "unseen" else f"fresh pages, {split} part"
    print(f"{name}: {sum(f['labelled'].values())} labelled texts of {f['sites']} sites ({labelled})")
    print(f"  kept by stage 3: {f['n_kept']} ({held})")
    print(f"  junk among the kept: {f['junk_share']:.1%} (bound {JUNK_BOUND:.0%}): "
          + ("PASS" if f["junk_share"] <= JUNK_BOUND else "FAIL"))
    print(f"  caption-labelled texts kept: {f['caption_kept']:.1%} (bound {CAPTION_BOUND:.0%}): "
          + ("PASS" if f["caption_kept"] >= CAPTION_BOUND else "FAIL"))


if __name__ == "__main__":
    main()
