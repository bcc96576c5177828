"""Captions a user would keep: stage 3 on the real-web pages, judged by the labelled set.

Runs stage 3 (`lait clean`, default settings: English kept) over the real-web mode's pages
twice, side by side: with this checkout's code, and with the code of main before issue 22
(commit BEFORE, exported with `git archive` into a temporary folder). Each run is
`run_clean.py` in a subprocess whose `lait` is that checkout's. Then, on the held-out half of
`labelled.json` (see README.md here):

- junk share: of the labelled (page, image, text) rows that stage 3 keeps as candidates, the
  share labelled `junk` (target: at most 5 %);
- page texts on several images: labelled `page` rows whose text stage 3 keeps as a candidate
  of more than one image of the page (target: none). An image is a picture as
  `lait.filters.page_texts.pictures` counts them: an `<img>` with all its URLs, images that
  share a URL or a `<figure>`, or the og image;
- planted captions: of the real-web mode's planted COCO captions, the share that are
  candidates of their photo (acceptance 2: at least 98 %), on all pages.

Then, with `--unseen-pages DIR` (trafilatura's evaluation pages, `unseen_pages.py`; see
README.md), on `unseen.json`, pages no rule was tuned on, and beside it the held-out half
again: the junk share and the caption-like (`describes`) share of the labelled rows stage 3
keeps with default settings, with the rules alone and with the rules and the caption judge
(which keeps figcaptions unjudged, as stage 3 does), and how many `describes` rows the judge
dropped. On the unseen set the judge is evaluated leave-site-out: its rows are split by site
into `--folds` groups, and each group is judged by a judge trained (`train_judge.fit_rows`) on
the tune half of labelled.json and the unseen rows of the other groups, never on its own sites,
with the threshold that rule chose on those training rows alone.
On the held-out half, the judge is trained on the tune half and all unseen rows (as shipped).

    .venv/bin/python bench/captions/bench_captions.py [--split heldout|tune|all] [--before COMMIT]
        [--unseen-pages DIR] [--folds 10]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BEFORE = "51afc47"  # main when issue 22 began
BASE = "http://127.0.0.1:8000"


def run_version(code: Path, data: Path, out: Path, pages: Path | None) -> list[dict]:
    cmd = [sys.executable, str(HERE / "run_clean.py"), "--code", str(code), "--data", str(data),
           "--out", str(out), "--languages", "en"]
    if pages is not None:
        cmd += ["--pages", str(pages)]
    subprocess.run(cmd, check=True, cwd=code)
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def image_groups(site, paths: list[str]) -> dict[tuple[str, str], int]:
    """(page path, local image path) -> the picture it shows: `lait.filters.page_texts.pictures`
    (images sharing a URL or a `<figure>` are one picture), the same for both versions."""
    from lait.filters.page_texts import pictures
    from lait.pagereader import parse_html

    out: dict[tuple[str, str], int] = {}
    for path in paths:
        tree = parse_html(site.route(path).body)
        if tree is not None:
            for url, n in pictures(tree, BASE + path).items():
                out[(path, url[len(BASE):])] = n
    return out


def judge(rows: list[dict], labelled: list[dict], groups: dict[tuple[str, str], int]) -> dict:
    kept = {(r["page"], r["image"], r["text"]) for r in rows}
    images_of_text: dict[tuple[str, str], set[int]] = defaultdict(set)
    for r in rows:
        images_of_text[(r["page"], r["text"])].add(groups.get((r["page"], r["image"]), hash(r["image"])))
    counts = {"describes": 0, "page": 0, "junk": 0}
    kept_junk: list[str] = []
    multi: set[tuple[str, str]] = set()
    for row in labelled:
        if (row["page"], row["image"], row["text"]) not in kept:
            continue
        counts[row["label"]] += 1
        if row["label"] == "junk":
            kept_junk.append(f"{row['source']}: {row['text'][:70]}")
        if row["label"] == "page" and len(images_of_text[(row["page"], row["text"])]) > 1:
            multi.add((row["page"], row["text"]))
    n = sum(counts.values())
    return {"kept": counts, "junk_share": counts["junk"] / n if n else 0.0, "page_multi": sorted(multi),
            "kept_junk": kept_junk, "rows": len(rows)}


def planted_recall(site, rows: list[dict]) -> tuple[int, int, list]:
    truth = site.ground_truth()
    got: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in rows:
        got[(r["page"], r["image"])].add(" ".join(r["text"].split()))
    # Stage 3 folds whitespace: "sitting next to  some umbrellas" is the planted caption.
    expected = [(path, ref["url"], " ".join(ref["true_caption"].split())) for path, page in truth["pages"].items()
                for ref in page["images"] if ref["true_caption"]]
    missed = [e for e in expected if e[2] not in got[(e[0], e[1])]]
    return len(expected) - len(missed), len(expected), missed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="heldout", choices=["heldout", "tune", "all"])
    ap.add_argument("--before", default=BEFORE, help="commit of the 'before' code")
    ap.add_argument("--show", action="store_true", help="list the junk kept and the page texts on several images")
    ap.add_argument("--unseen-pages", default=None, help="directory of unseen_pages.py (skipped when absent)")
    ap.add_argument("--folds", type=int, default=10, help="site groups of the leave-site-out evaluation")
    ap.add_argument("--threshold", type=float, default=None,
                    help="judge threshold for every fold (default: each judge's, chosen on its training rows)")
    args = ap.parse_args()
    data = REPO.parent / "shared" / "data"
    if not (data / "html").is_dir():
        sys.exit("../shared/data is absent")
    sys.path.insert(0, str(REPO))
    from lait.testkit.realweb import RealWebSite

    labelled = [r for r in json.loads((HERE / "labelled.json").read_text(encoding="utf-8"))["rows"]
                if args.split == "all" or r["split"] == args.split]
    site = RealWebSite(data)
    paths = [p for p in site.page_paths() if p != "/"]
    groups = image_groups(site, paths)
    with tempfile.TemporaryDirectory(prefix="bench-captions-") as tmp:
        tmp_path = Path(tmp)
        before = tmp_path / "before"
        before.mkdir()
        archive = subprocess.run(["git", "archive", args.before], cwd=REPO, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        results = {}
        for name, code in (("main before", before), ("this branch", REPO)):
            rows = run_version(code, data, tmp_path / f"{name.replace(' ', '_')}.jsonl", None)
            results[name] = (judge(rows, labelled, groups), planted_recall(site, rows), rows)

    split_pages = {r["page"] for r in labelled}
    print(f"labelled rows ({args.split}): {len(labelled)} on {len(split_pages)} pages; "
          f"stage 3 over all {len(paths)} real-web pages, --languages en")
    print(f"{'':48s}{'main before':>14s}{'this branch':>14s}")
    a, b = results["main before"][0], results["this branch"][0]
    for label in ("describes", "page", "junk"):
        print(f"{'labelled ' + label + ' rows kept as candidates':48s}{a['kept'][label]:>14d}{b['kept'][label]:>14d}")
    print(f"{'junk share of kept candidates (target <= 5 %)':48s}{a['junk_share']:>13.1%}{b['junk_share']:>14.1%}")
    print(f"{'page texts on more than one image (target 0)':48s}{len(a['page_multi']):>14d}{len(b['page_multi']):>14d}")
    pa, pb = results["main before"][1], results["this branch"][1]
    print(f"{'planted captions candidates of their photo':48s}{pa[0] / pa[1]:>13.1%}{pb[0] / pb[1]:>14.1%}"
          f"   ({pa[0]}/{pa[1]}, {pb[0]}/{pb[1]}; target >= 98 %)")
    print(f"{'candidate texts written (all pages)':48s}{a['rows']:>14d}{b['rows']:>14d}")
    old = {(r["page"], r["image"], r["text"]) for r in results["main before"][2]}
    new = [r for r in results["this branch"][2] if (r["page"], r["image"], r["text"]) not in old]
    print(f"candidate texts this branch keeps that main did not: {len(new)} "
          f"(on {args.split} pages: {sum(r['page'] in split_pages for r in new)})")
    if args.show:
        for name in results:
            res = results[name][0]
            print(f"\n{name}: junk kept: " + " | ".join(res["kept_junk"]))
            print(f"{name}: page texts on several images: " + " | ".join(t[:60] for _, t in res["page_multi"]))
        print("\nnew texts: " + " | ".join(f"{r['source']}: {r['text'][:60]}" for r in new[:40]))
    if args.unseen_pages:
        if not (Path(args.unseen_pages) / "index.json").is_file():
            print(f"\nunseen pages: no index.json in {args.unseen_pages}; skipped (see README.md)")
        else:
            unseen_figures(data, Path(args.unseen_pages), args.folds, args.threshold, args.show)


def shares(rows: list[dict]) -> str:
    n = len(rows)
    junk = sum(r["label"] == "junk" for r in rows)
    desc = sum(r["label"] == "describes" for r in rows)
    return (f"{n:>6d} rows  junk {junk / n if n else 0:6.1%}  describes {desc / n if n else 0:6.1%}")


def unseen_figures(data: Path, pages: Path, folds: int, threshold: float | None, show: bool) -> None:
    """Junk and caption-like shares of the kept labelled rows: unseen set (leave-site-out) and
    held-out half, rules alone and rules with the judge. Each judge's threshold is chosen on its
    own training rows (`train_judge.fit_rows`), unless `threshold` fixes one for all."""
    sys.path.insert(0, str(HERE))
    from judge_data import collect, labelled, rows_with_inputs, unseen
    from train_judge import features, fit_rows, site_fold


    shared_any = collect(data, languages=("any",))
    unseen_any = collect(data, pages_dir=pages, languages=("any",))
    unseen_en = collect(data, pages_dir=pages, languages=("en",))
    shared_en = collect(data, languages=("en",))
    tune, _ = rows_with_inputs(labelled("tune"), shared_any)
    train_unseen, _ = rows_with_inputs(unseen(), unseen_any)
    kept_unseen, _ = rows_with_inputs(unseen(), unseen_en)
    kept_heldout, _ = rows_with_inputs(labelled("heldout"), shared_en)

    def verdicts(judge, rows: list[dict]) -> list[dict]:
        th = threshold if threshold is not None else judge.threshold
        p = judge.p_junk_of_matrix(features(rows))
        return [{**r, "p": float(q) if r["asked"] else 0.0, "dropped": r["asked"] and q >= th}
                for r, q in zip(rows, p)]

    judged_unseen: list[dict] = []
    fold_thresholds = []
    for k in range(folds):
        test = [r for r in kept_unseen if site_fold(r, folds) == k]
        if not test:
            continue
        judge = fit_rows(tune + [r for r in train_unseen if site_fold(r, folds) != k])
        fold_thresholds.append(judge.threshold)
        judged_unseen += verdicts(judge, test)
    judge = fit_rows(tune + train_unseen)  # never saw the held-out half: the shipped judge
    judged_heldout = verdicts(judge, kept_heldout)

    n_pages = len({r["page_id"] for r in unseen()})
    how = (f"threshold {threshold:g}" if threshold is not None else
           f"thresholds chosen on each fold's training rows: {', '.join(f'{t:g}' for t in fold_thresholds)}")
    print(f"\nunseen.json: {len(unseen())} labelled rows on {n_pages} pages of "
          f"{len({r['site'] for r in unseen()})} sites; stage 3 default settings (--languages en)")
    print(f"  unseen, rules only                          {shares(kept_unseen)}")
    print(f"  unseen, rules + judge (leave-site-out, {folds} site groups, {how})"
          f"\n                                              {shares([r for r in judged_unseen if not r['dropped']])}"
          "   (target: junk <= 5 %)")
    shipped = threshold if threshold is not None else judge.threshold
    print(f"  held-out half, rules only                   {shares(kept_heldout)}")
    print(f"  held-out half, rules + judge (tune+unseen, threshold {shipped:g})"
          f"\n                                              {shares([r for r in judged_heldout if not r['dropped']])}"
          "   (target: junk <= 5 %)")
    for name, rows in (("unseen", judged_unseen), ("held-out", judged_heldout)):
        dropped = [r for r in rows if r["dropped"]]
        by = {lab: sum(r["label"] == lab for r in dropped) for lab in ("describes", "page", "junk")}
        print(f"  judge dropped on {name}: {by} (describes rows lost: {by['describes']} of "
              f"{sum(r['label'] == 'describes' for r in rows)})")
        if show:
            for r in sorted(rows, key=lambda r: -r["p"]):
                if r["dropped"] != (r["label"] == "junk"):
                    print(f"    {r['label']:9s} p={r['p']:.2f} {r['source']}: {r['text'][:70]}")
    for lo in (0.3, 0.4, 0.5, 0.6, 0.7):
        print(f"  threshold {lo:.1f} (for reference, not chosen by): unseen "
              f"{shares([r for r in judged_unseen if r['p'] < lo])} | held-out "
              f"{shares([r for r in judged_heldout if r['p'] < lo])}")


if __name__ == "__main__":
    main()
