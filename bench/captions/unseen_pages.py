"""Extract the unseen pages (trafilatura's evaluation pages) from a git checkout of trafilatura.

The pages are real web pages of about a thousand sites, gathered by trafilatura's author for
its extraction evaluation (`tests/evaldata.json` maps each page's URL to its file in
`tests/eval/` or `tests/cache/`). They are not part of `../shared/data`, and no rule of
`lait/filters` was written or tuned on them. See README.md here for the commit and licence.

    git clone https://github.com/adbar/trafilatura /tmp/trafilatura
    python bench/captions/unseen_pages.py --git /tmp/trafilatura --out /work/unseen-pages

Writes OUT/index.json, a list of {"id", "url", "site", "file"}, and OUT/pages/ID.html: the
bytes exactly as they are at the commit. `id` is the first 12 hex digits of the SHA-1 of the URL.
Pages whose URL or bytes are also among the shared pages (`--data`) are left out.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

COMMIT = "e90b0ef5"  # adbar/trafilatura, where these pages were read


def git_show(git: Path, commit: str, path: str) -> bytes:
    return subprocess.run(["git", "-C", str(git), "show", f"{commit}:{path}"], check=True,
                          capture_output=True).stdout


def shared_fingerprints(data: Path) -> tuple[set[str], set[str]]:
    """URLs and SHA-1s of the bytes of the shared pages (to leave them out)."""
    urls: set[str] = set()
    digests: set[str] = set()
    aeb = data / "html" / "aeb"
    if (aeb / "ground-truth.json").is_file():
        for page_id, info in json.loads((aeb / "ground-truth.json").read_text()).items():
            urls.add(info["url"].rstrip("/"))
            f = aeb / "html" / f"{page_id}.html.gz"
            if f.is_file():
                digests.add(hashlib.sha1(gzip.decompress(f.read_bytes())).hexdigest())
    for f in (data / "html" / "readability").glob("*/source.html"):
        digests.add(hashlib.sha1(f.read_bytes()).hexdigest())
    return urls, digests


_TLDS = {"com", "net", "org", "info", "de", "at", "ch", "fr", "uk", "es", "it", "cu", "hn", "jm", "vc", "pa",
         "gov", "co", "eu", "io", "news"}


def site_of(url: str) -> str:
    """The host of a page's URL without `www.`; a few pages are listed as `hard::FILE` instead
    of a URL, their file named after the site (`example.com-words.html`)."""
    if url.startswith("hard::"):
        name = url.split("::", 1)[1].removesuffix(".html").split("-", 1)[0].removeprefix("www.").lower()
        parts = name.split(".")
        # "dw.com.colonial": the host ends at its top-level domain (and a country after com, gov).
        for i in range(1, len(parts)):
            if parts[i] in _TLDS:
                end = i + 1 + (i + 1 < len(parts) and parts[i] in ("com", "co", "gov") and len(parts[i + 1]) == 2)
                return ".".join(parts[:end])
        return name
    return (urlsplit(url).hostname or "").removeprefix("www.")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--git", required=True, help="a clone (or bare mirror) of adbar/trafilatura")
    ap.add_argument("--commit", default=COMMIT)
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2].parent / "shared" / "data"))
    args = ap.parse_args(argv)
    git, out = Path(args.git), Path(args.out)
    (out / "pages").mkdir(parents=True, exist_ok=True)
    shared_urls, shared_digests = shared_fingerprints(Path(args.data))
    listing = set(subprocess.run(["git", "-C", str(git), "ls-tree", "-r", "--name-only", args.commit, "tests/"],
                                 check=True, capture_output=True, text=True).stdout.splitlines())
    evaldata = json.loads(git_show(git, args.commit, "tests/evaldata.json"))
    index, skipped = [], 0
    for url, info in sorted(evaldata.items()):
        path = next((p for p in (f"tests/eval/{info['file']}", f"tests/cache/{info['file']}") if p in listing), None)
        if path is None or url.rstrip("/") in shared_urls:
            skipped += 1
            continue
        raw = git_show(git, args.commit, path)
        if hashlib.sha1(raw).hexdigest() in shared_digests:
            skipped += 1
            continue
        page_id = hashlib.sha1(url.encode()).hexdigest()[:12]
        site = site_of(url)
        (out / "pages" / f"{page_id}.html").write_bytes(raw)
        index.append({"id": page_id, "url": url, "site": site, "file": f"pages/{page_id}.html"})
    (out / "index.json").write_text(json.dumps(index, indent=1))
    print(f"{len(index)} pages of {len({p['site'] for p in index})} sites written to {out}; {skipped} left out")


if __name__ == "__main__":
    main()
