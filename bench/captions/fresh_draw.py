"""Draw the texts to label from stage 3's raw pool over the fresh pages (issue 62).

Stage 3 runs over the pages `fresh_pages.py` wrote (the real-web mode, `run_clean.py
--pages-dir`) with every text rule off (`rules_off`: all of `skippable_rules()` but language)
and `--languages any`: the raw pool, every text any setting of stage 3 could keep. The planted
COCO figures are left out (their captions are known and measured apart). A unit is one text of
one page, with the sources it came from and the images it was offered to (their URLs as the
page had them, and whether the page declared them small).

From each split, `--n` units are drawn uniformly at random (Python `random.seed(62)`,
`random.sample`) among those of sites that have not already given `--per-site` units, so that
the draw spreads over sites; written to bench/captions/fresh_dev.json and fresh_test.json with
`label` empty, for people to fill in by the definitions in bench/captions/README.md.

    .venv/bin/python bench/captions/fresh_draw.py --pages-dir /work/fresh-pages --pool POOL.jsonl [--n 400]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def pool_units(pool: Path, pages_dir: Path, data: Path) -> list[dict]:
    """One dict per (page, text) of the raw pool, planted figures left out."""
    from lait.testkit.realweb import RealWebSite

    index = {f"/{p['site']}/{p['id']}.html": p for p in json.loads((pages_dir / "index.json").read_text())}
    truth = RealWebSite(data, pages_dir=pages_dir).ground_truth()["pages"]
    units: dict[tuple[str, str], dict] = {}
    for line in pool.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if r["image"].startswith("/photos/coco/"):
            continue
        page = index[r["page"]]
        original = {ref["url"]: ref["original_url"] for ref in truth[r["page"]]["images"]}
        u = units.setdefault((r["page"], r["text"]), {
            "page_id": page["id"], "site": page["site"], "split": page["split"], "url": page["url"],
            "text": r["text"], "sources": [], "images": []})
        if r["source"] not in u["sources"]:
            u["sources"].append(r["source"])
        image = original.get(r["image"]) or r["image"]
        if image not in u["images"]:
            u["images"].append(image)
    return sorted(units.values(), key=lambda u: (u["page_id"], u["text"]))


def draw(units: list[dict], n: int, per_site: int, seed: int = 62) -> list[dict]:
    rng = random.Random(seed)
    order = rng.sample(units, len(units))
    taken: dict[str, int] = defaultdict(int)
    out = []
    for u in order:
        if taken[u["site"]] >= per_site:
            continue
        taken[u["site"]] += 1
        out.append(u)
        if len(out) == n:
            break
    return sorted(out, key=lambda u: (u["site"], u["page_id"], u["text"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages-dir", required=True)
    ap.add_argument("--pool", required=True, help="run_clean.py's output with every text rule off")
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--per-site", type=int, default=6)
    args = ap.parse_args()
    units = pool_units(Path(args.pool), Path(args.pages_dir), Path(args.data))
    for split in ("dev", "test"):
        mine = [u for u in units if u["split"] == split]
        rows = [{**u, "label": "", "note": ""} for u in draw(mine, args.n, args.per_site)]
        out = REPO / "bench" / "captions" / f"fresh_{split}.json"
        out.write_text(json.dumps({"about": f"Texts of stage 3's raw pool over the fresh pages, {split} part: "
                                            "see bench/captions/README.md (fresh pages)", "rows": rows},
                                  ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"{split}: {len(rows)} texts of {len({r['site'] for r in rows})} sites drawn from {len(mine)} "
              f"(page, text) units -> {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
