"""The sample's JSON keeps the licence declared for the image apart from its page's (issue 33):
`license` is the page's, `image_license` the figure's or the file's, with `image_license_from`."""

from __future__ import annotations

import io
import json
import tarfile

from kit.build_data import _ok_row, _pair, photo
from lait.build.config import BuildConfig
from lait.build.pipeline import build
from lait.workdir import WorkDir, partition_of

SITE = "http://blog.test"
PAGE_CC = "https://creativecommons.org/licenses/by/4.0/"
FIGURE_CC = "https://creativecommons.org/licenses/by-sa/2.0/"


def test_image_licences_reach_the_sample_json_apart_from_the_pages(tmp_path):
    work = WorkDir(tmp_path / "work", n_partitions=2).init()
    images = {"figure": (None, FIGURE_CC), "file": ("(c) Jane Doe", None), "both": ("(c) Jane Doe", FIGURE_CC),
              "none": (None, None)}
    ok, scored = [], []
    for i, (name, (rights, figure)) in enumerate(images.items()):
        url = f"{SITE}/img/{name}.jpg"
        ok.append({**_ok_row(url, photo(i)), "rights": rights})
        scored.append({**_pair(url, f"{SITE}/post.html", f"A heron number {i} in the lake", "figcaption", 0.3),
                       "license": PAGE_CC, "image_license": figure})
    for table, rows in (("images_ok", ok), ("scored", scored)):
        for p in {partition_of(r["image_url"], 2) for r in rows}:
            w = work.writer(table, p, "input")
            w.write_many([r for r in rows if partition_of(r["image_url"], 2) == p])
            w.close()
    assert build(BuildConfig(work=str(work.root), workers=1, progress=False)).ok
    samples = {}
    for tar in (work.root / "shards").glob("*.tar"):
        with tarfile.open(tar) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".json"):
                    s = json.load(io.TextIOWrapper(tf.extractfile(m)))
                    samples[s["url"].rsplit("/", 1)[1][:-4]] = s
    got = {name: (s["license"], s["image_license"], s["image_license_from"]) for name, s in samples.items()}
    assert got == {"figure": (PAGE_CC, FIGURE_CC, "figure"), "file": (PAGE_CC, "(c) Jane Doe", "file"),
                   "both": (PAGE_CC, FIGURE_CC, "figure"), "none": (PAGE_CC, "", "")}
