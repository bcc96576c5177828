"""The plan's `meta` made by column (`plan_metas`) is the text `plan_meta` writes for each picture."""

from __future__ import annotations

import json

from lait.build.aggregate import Cand, Group, Image, plan_meta, plan_metas
from lait.build.config import BuildConfig

NASTY = ['say "hi"', "back\\slash", "tab\tnew\nline", "ctl\x01", "déjà ✓ 😀", "", "\u2028"]


def cand(i: int, k: int) -> Cand:
    text = f"caption {k} of {i} {NASTY[(i + k) % len(NASTY)]}"
    return Cand(text, ["alt", "figcaption", "context"][k % 3], [None, "en", "fr"][(i + k) % 3],
                [0.25, 1.0, 0.30000000000000004, 1e-05, float("nan")][(i + k) % 5], f"http://p.test/{i % 4}.html",
                "ViT-B-32", [None, "openai"][i % 2], [None, "cc-by"][i % 2], [None, "cc0"][k % 2], text)


def group(i: int) -> Group:
    members = [Image(f"http://i.test/{i}/{m}{NASTY[m % len(NASTY)]}.jpg", f"{i:064x}", i * 7919 + m, 640 + i, 480, "JPEG",
                     f"p{i % 16:05d}-x.parquet", i % 3, i, [cand(i, k) for k in range(1 + i % 4)],
                     [None, 0.1234567, 1.0][i % 3], [None, [], [[0.1, 0.25, 0.5, 1.0]], [[0.0, 0.0, 1, 1], [0.5, 0.5, 0.75, 0.8]]][i % 4],
                     [None, "All rights reserved"][i % 2]) for m in range(1 + i % 20)]
    g = Group(members, members[0], [c for im in members for c in im.candidates], pages=1 + i % 5)
    return g


def test_metadata_by_column_is_the_text_of_plan_meta():
    groups = [group(i) for i in range(60)]
    cfg = BuildConfig(work="unused", max_candidates=3)
    extras = [{"list_id": i, "b": "x"} if i % 7 == 0 else None for i in range(60)]
    for ex in (None, extras):
        got = plan_metas(groups, cfg, ex).to_pylist()
        assert got == [plan_meta("", g, cfg, ex[i] if ex else None) for i, g in enumerate(groups)]
    assert all(t == json.dumps(json.loads(t), ensure_ascii=False, sort_keys=True) for t in got)


def test_no_pictures_no_metadata():
    assert plan_metas([], BuildConfig(work="unused")).to_pylist() == []
