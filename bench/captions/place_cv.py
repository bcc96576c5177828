"""Would a model over where a text sits beat stage 3's place rules on sites it never saw? (issue 62)

Leave-site-out cross-validation over the development rows only: fresh_dev.json (the fresh
pages' development part) and unseen.json (trafilatura's pages, `--unseen-pages`), 950 labelled
texts of about 390 sites. The test part is not read.

Each labelled text gets DOM and text features of its image as the page has it: what
`lait.filters.image_place` finds (the kind of chrome or region, one column each, and whether
`Place.drops` drops the text), every class/id token of NAME_TOKENS or REGION_TOKENS above the
image without the rules' stop at the article's container, the tags above it (article, main,
figure, header, footer, nav, aside, li, picture), the image's declared width, how many images of
the page sit in a parent of the same shape (a teaser list), whether the text is a link's text of
the page or inside trafilatura's main text, the image's rank, the text's source, length, digits,
capitals and cut ending; with `--embedding`, also its `minilm-static` sentence embedding.

A logistic regression (`lait.filters.caption_judge.fit`, target junk) and, where scikit-learn
is installed, gradient-boosted trees are trained on four of five site groups and give the fifth
its probabilities (three shuffles of the groups, averaged). A text is kept when the rules keep
it (stage 3 with `caption_judge: none`, or with the place rules, `place`) and its probability is
under the threshold. Printed per development set: kept texts, junk among them, caption-labelled
texts kept, beside the place rules' own figures.

    .venv/bin/python bench/captions/place_cv.py --unseen-pages /work/unseen-pages [--embedding]
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import math
import re
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

SOURCES = ("alt", "title", "aria", "figcaption", "og", "context")
CHROME_KINDS = ("declared", "an SVG", "its file", "its folder", "inside <", "linking to an author",
                "linking to another site", "linking to ", "inside a <footer", "inside a <nav")
REGION_KINDS = ("declared", "inside <", "linking to another page", "inside a <header", "inside a <aside")
TAGS_ABOVE = ("article", "main", "figure", "header", "footer", "nav", "aside", "li", "picture")
THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
FOLDS, SHUFFLES = 5, 3


def _kind(reason: str | None, kinds: tuple[str, ...]) -> int:
    if not reason:
        return -1
    return next((i for i, k in enumerate(kinds) if reason.startswith(k)), len(kinds) - 1)


def _shape(el, depth: int = 3) -> str:
    from lait.filters.image_place import _tokens

    out = []
    for _ in range(depth):
        el = el.getparent()
        if el is None:
            break
        out.append(el.tag + "." + ".".join(sorted(_tokens(el.get("class")))))
    return "/".join(out)


def page_info(html: bytes, url: str) -> dict:
    from lxml import html as lxml_html

    from lait.filters import image_place as ip
    from lait.filters.extract_stage import _main_text
    from lait.filters.html_images import find_images

    tree = lxml_html.document_fromstring(html)
    images = find_images(tree, url)
    try:
        main = _main_text(tree)
    except Exception:  # noqa: BLE001  a page trafilatura cannot read has no main text
        main = ""
    return {"url": url, "images": images, "n": len(images), "links": ip.link_texts(tree),
            "selves": ip.own_urls(tree, url), "main": ip._words(main),
            "shapes": Counter(_shape(im.element) for im in images if im.element is not None)}


def features(info: dict, im, source: str, text: str) -> dict[str, float]:
    from lait.filters import image_place as ip

    f = {f"source_{s}": float(source == s) for s in SOURCES}
    letters = sum(map(str.isalpha, text))
    key = ip._words(text)
    f.update(log_words=math.log1p(len(text.split())), digits=sum(map(str.isdigit, text)) / max(1, len(text)),
             upper=sum(map(str.isupper, text)) / max(1, letters),
             cut=float(bool(re.search(r"(\.\.\.|…)\s*$", text))), sentence_end=float(bool(re.search(r"[.!?。]\s*$", text))),
             is_link_text=float(key in info["links"]),
             in_link_text=float(len(key) > 15 and any(key in k for k in info["links"])),
             in_main=float(len(key) > 10 and key in info["main"]),
             position=im.position / max(1, info["n"]), log_images=math.log1p(info["n"]),
             og_image=float(im.element is None))
    if im.element is None:
        return f
    el = im.element
    place = ip.image_place(el, info["url"], im.urls, info["selves"])
    chrome, region = _kind(place.chrome, CHROME_KINDS), _kind(place.region, REGION_KINDS)
    f.update({f"chrome_{i}": float(chrome == i) for i in range(len(CHROME_KINDS))})
    f.update({f"region_{i}": float(region == i and chrome < 0) for i in range(len(REGION_KINDS))})
    f["place_drops"] = float(place.drops(source, text, info["links"]) is not None)
    w, h = ip._px(el.get("width")), ip._px(el.get("height"))
    f["has_size"], f["log_width"] = float(bool(w and h)), math.log1p(w or 0) / 7
    names, tags, in_link = set(), set(), 0.0
    for a in el.iterancestors():
        if not isinstance(a.tag, str):
            break
        names |= ip._tokens(a.get("class")) | ip._tokens(a.get("id"))
        tags.add(a.tag)
        in_link = 1.0 if a.tag == "a" and a.get("href") else in_link
    f.update(any_name_token=float(bool(names & ip.NAME_TOKENS)), any_region_token=float(bool(names & ip.REGION_TOKENS)),
             in_any_link=in_link, same_shape=math.log1p(info["shapes"][_shape(el)] - 1),
             in_a_figure=float(im.figure is not None))
    f.update({f"in_{t}": float(t in tags) for t in TAGS_ABOVE})
    return f


def fresh_dev_rows(data: Path) -> list[dict]:
    from fresh_pages import fresh_index

    pages = {p["id"]: p for p in fresh_index(data)}
    by_page: dict[str, list[dict]] = {}
    for r in json.loads((HERE / "fresh_dev.json").read_text())["rows"]:
        by_page.setdefault(r["page_id"], []).append(r)
    out = []
    for pid, rows in by_page.items():
        p = pages[pid]
        url = p["url"] if "://" in p["url"] else f"https://fresh.invalid/{pid}.html"
        info = page_info(gzip.decompress(Path(p["path"]).read_bytes()), url)
        for r in rows:
            im = next((im for im in info["images"] if set(im.urls) & set(r["images"])), None)
            if im is not None:
                out.append({"set": "dev", "key": (pid, r["text"]), "site": r["site"], "label": r["label"],
                            "f": features(info, im, r["sources"][0], r["text"])})
    return out


def unseen_dev_rows(data: Path, pages_dir: Path) -> list[dict]:
    from bench_fresh import unseen_rows
    from run_clean import BASE

    from lait.testkit.realweb import RealWebSite

    site = RealWebSite(data, pages_dir=pages_dir)
    by_page: dict[str, list[dict]] = {}
    for r in unseen_rows():
        by_page.setdefault(r["page"], []).append(r)
    out = []
    for path, rows in by_page.items():
        url = site.original(path)[1]
        url = url if url.startswith(("http://", "https://")) else BASE + path
        info = page_info(site.route(path).body, url)
        for r in rows:
            im = next((im for im in info["images"]
                       if any(u == BASE + r["image"] or urlsplit(u).path == r["image"] for u in im.urls)), None)
            if im is not None:
                out.append({"set": "unseen", "key": ((r["page"], r["image"]), r["text"]), "site": r["site"],
                            "label": r["label"], "f": features(info, im, r["source"], r["text"])})
    return out


def out_of_fold(x, y, groups, fit_predict) -> "np.ndarray":
    import numpy as np

    p = np.zeros(len(y))
    names = sorted(set(groups))
    for seed in range(SHUFFLES):
        perm = np.random.RandomState(seed).permutation(len(names))
        fold = np.array([perm[names.index(g)] % FOLDS for g in groups])
        for k in range(FOLDS):
            te = fold == k
            p[te] += fit_predict(x[~te], y[~te], x[te]) / SHUFFLES
    return p


def main() -> None:
    import numpy as np
    from bench_fresh import fresh_kept, unseen_kept

    from lait.filters.caption_judge import fit

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--unseen-pages", required=True, help="unseen_pages.py's folder (README.md)")
    ap.add_argument("--embedding", action="store_true", help="also the texts' minilm-static embeddings")
    args = ap.parse_args()
    logging.getLogger("trafilatura").setLevel(logging.ERROR)
    data, pages_dir = Path(args.data), Path(args.unseen_pages)
    rows = fresh_dev_rows(data) + unseen_dev_rows(data, pages_dir)
    kept = {}
    for mode in ("none", "place"):
        found = {(p, t) for p, t in fresh_kept(data, {"caption_judge": mode}, "dev")}
        found |= {((p, i), t) for p, i, t in unseen_kept(data, pages_dir, {"caption_judge": mode})}
        kept[mode] = np.array([r["key"] in found for r in rows])
    names = sorted(set().union(*(r["f"] for r in rows)))
    x = np.array([[r["f"].get(n, 0.0) for n in names] for r in rows])
    if args.embedding:
        from lait.models import load_sentence_encoder

        x = np.concatenate([x, load_sentence_encoder("minilm-static").encode([r["key"][1] for r in rows])], 1)
    y = np.array([r["label"] == "junk" for r in rows])
    caption = np.array([r["label"] == "caption" for r in rows])
    part = np.array([r["set"] for r in rows])
    groups = [r["site"] for r in rows]
    print(f"{len(rows)} labelled development texts ({(part == 'dev').sum()} fresh dev, "
          f"{(part == 'unseen').sum()} unseen.json) of {len(set(groups))} sites, {x.shape[1]} features")

    def line(keep) -> str:
        out = []
        for name in ("dev", "unseen"):
            m = part == name
            k = keep & m
            out.append(f"{name}: kept {k.sum()}, junk {y[k].sum() / max(1, k.sum()):.1%}, "
                       f"captions kept {caption[k].sum() / max(1, caption[m].sum()):.1%}")
        return " | ".join(out)

    print(f"{'rules without place (none)':<34}", line(kept["none"]))
    print(f"{'place rules (the defaults)':<34}", line(kept["place"]))
    models = {"logistic": lambda a, b, c: fit(a, b.astype(float), l2=30.0).p_junk_of_matrix(c)}
    try:
        from sklearn.ensemble import HistGradientBoostingClassifier

        models["boosted trees"] = lambda a, b, c: HistGradientBoostingClassifier(
            max_depth=3, max_iter=150, learning_rate=0.05, class_weight="balanced", min_samples_leaf=10,
            random_state=0).fit(a, b).predict_proba(c)[:, 1]
    except ImportError:
        print("(scikit-learn is not installed: no boosted trees)")
    for label, fit_predict in models.items():
        p = out_of_fold(x, y, groups, fit_predict)
        for base in ("none", "place"):
            for th in THRESHOLDS:
                print(f"{label + ', ' + base + ' and p < ' + str(th):<34}", line(kept[base] & (p < th)))


if __name__ == "__main__":
    main()
