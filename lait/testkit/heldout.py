"""A held-out evaluation set for the demo web: the photos of another site, with their true captions.

`lait compare` judges a selection by retrieval on pictures it never trained on. For the demo
web, those come from a site generated with another seed. Its scenes are drawn afresh, but the
simplest ones (one shape on a plain background) can come out alike across seeds, so the set is
only disjoint together with `lait compare`'s `--exclude-eval` check, which drops the pool pictures
that copy one of its pictures (12 of the demo's 248 for a 100-article set). Each picture the ground truth keeps (not a duplicate, thumbnail,
logo, banner or opt-out) is written with its own true caption as a Karpathy-style JSON, the
format of Flickr8k's split in ../shared/data.
"""

from __future__ import annotations

import json
from pathlib import Path

from lait.writers import atomic_write_json

JSON_NAME = "karpathy.json"


def write_heldout_set(out: str | Path, pages: int, seed: int, split: str = "test") -> Path:
    """Write `out/images/*.jpg` and `out/karpathy.json` (one true caption per picture) from a
    demo site of `pages` articles generated with `seed`; returns the JSON's path. A folder that
    already holds the set of these settings is kept as it is."""
    from lait.testkit.generator import generate_site

    out = Path(out)
    path = out / JSON_NAME
    if path.is_file():
        done = json.loads(path.read_text()).get("made_from", {})
        if done == {"pages": pages, "seed": seed, "split": split}:
            return path
    site = generate_site(pages, seed)
    truth = site.ground_truth()
    (out / "images").mkdir(parents=True, exist_ok=True)
    items = []
    for url, info in truth["images"].items():
        if not info["keep"] or not info.get("true_caption") or info.get("format") != "JPEG":
            continue
        resp = site.route(url)
        if resp.status != 200:
            continue
        name = url.strip("/").replace("/", "_")
        (out / "images" / name).write_bytes(resp.body)
        items.append({"filepath": "images", "filename": name, "split": split, "url": url,
                      "sentences": [{"raw": info["true_caption"]}]})
    if not items:
        raise ValueError(f"a demo site of {pages} pages (seed {seed}) has no picture to evaluate on")
    atomic_write_json(path, {"made_from": {"pages": pages, "seed": seed, "split": split}, "images": items})
    return path
