"""The fresh real pages of ../shared/data/html/fresh, split by site, as the real-web mode serves them (issue 62).

../shared/data/html/fresh/SOURCE/ holds 313 real pages of about 240 sites that no rule or model
of lait was written or tuned on (fundus, newspaper, goose3 and newspaper4k test data; each
folder's index.tsv gives the page's URL and host). This script writes them, ungzipped, into a
folder outside the repository in the layout `run_clean.py --pages-dir` and
`lait.testkit.realweb.RealWebSite(pages_dir=...)` read: OUT/index.json, a list of
{"id", "url", "site", "file", "split"}, and OUT/pages/ID.html, the bytes as they are in the
data set. `id` is the first 12 hex digits of the SHA-1 of the URL.

**The split is by site** (`site_of`: the registered domain, so that www.example.com and
news.example.com are one site): a site whose SHA-1 starts with a hex digit below 8 is `test`,
every other `dev`. Every page of a site is on the same side, so no rule learned on a
development page can have seen the test part's markup. Features, encoders and thresholds are
chosen on `dev` only; `test` is read once, at the end, by `bench_fresh.py`.

    .venv/bin/python bench/captions/fresh_pages.py --out /work/fresh-pages
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import json
from pathlib import Path

from lait.filters.image_place import registered_domain

REPO = Path(__file__).resolve().parents[2]


def site_of(host: str) -> str:
    """The registered domain of a host (`lait.filters.image_place.registered_domain`: its last
    two labels, or three under a country code's second-level domain, bbc.co.uk, abc.net.au)."""
    return registered_domain(host)


def split_of(site: str) -> str:
    """`test` for about half the sites, `dev` for the others, by the SHA-1 of the site."""
    return "test" if hashlib.sha1(site.encode()).hexdigest()[0] < "8" else "dev"


def fresh_index(data: Path) -> list[dict]:
    """{"id", "url", "site", "split", "source", "path"} of every fresh page (`path`: its .gz file)."""
    out = []
    for index in sorted((data / "html" / "fresh").glob("*/index.tsv")):
        with open(index, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f, delimiter="\t"):
                site = site_of(row["host"])
                out.append({"id": hashlib.sha1(row["url"].encode()).hexdigest()[:12], "url": row["url"],
                            "site": site, "split": split_of(site), "source": index.parent.name,
                            "path": str(index.parent / (row["file"] + ".gz"))})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--out", required=True, help="folder to write (outside the repository)")
    args = ap.parse_args()
    out = Path(args.out)
    if out.resolve().is_relative_to(REPO):
        raise SystemExit(f"{out}: the pages stay out of the repository")
    (out / "pages").mkdir(parents=True, exist_ok=True)
    index, seen = [], set()
    for page in fresh_index(Path(args.data)):
        if page["id"] in seen:  # one URL in two source folders
            continue
        seen.add(page["id"])
        (out / "pages" / f"{page['id']}.html").write_bytes(gzip.decompress(Path(page["path"]).read_bytes()))
        index.append({"id": page["id"], "url": page["url"], "site": page["site"], "file": f"pages/{page['id']}.html",
                      "split": page["split"]})
    (out / "index.json").write_text(json.dumps(index, indent=1))
    for split in ("dev", "test"):
        pages = [p for p in index if p["split"] == split]
        print(f"{split}: {len(pages)} pages of {len({p['site'] for p in pages})} sites")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
