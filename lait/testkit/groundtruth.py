"""Compare built shards with a local web's ground truth (`lait.testkit` ground-truth JSON).

`lait demo` prints this after a run, and the end-to-end tests assert on it:
- precision: kept samples whose caption is, or contains, a true caption of their image (the
  others are `wrong`: a text on a picture it does not describe);
- coverage: images the ground truth keeps that are in the shards (directly or as the kept
  copy of a duplicate group);
- duplicates: pictures that appear more than once; unwanted: samples the ground truth rejects
  for reasons no later stage can undo (logo, icons, banners...);
- foreign captions: samples whose caption is none of their own picture's true captions but
  another picture's (a text moved between pictures that were wrongly taken for copies), and
  samples that list such a text among their scored candidates.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

# Images the ground truth drops whatever their texts: their presence in shards is a defect.
HARD_REASONS = ("filter/min_side", "filter/aspect_ratio", "filter/uninformative", "crawl/")


def _norm(text: str) -> str:
    return re.sub(r"[\W_]+", " ", text.casefold()).strip()


def _path(url: str) -> str:
    """Ground truth is keyed by path; shards hold absolute URLs of the server's port."""
    m = re.match(r"^[a-z]+://[^/]+(/.*)$", url)
    return m.group(1) if m else url


def true_captions(truth: dict[str, Any], *, english: bool = True) -> dict[str, set[str]]:
    """Image path -> its true captions (normalised): each image entry's `true_caption` (and its
    `caption_en` with `english`) and the captions the pages give the images they show."""
    out: dict[str, set[str]] = {}
    for u, v in truth["images"].items():
        for c in (v.get("true_caption"), v.get("caption_en") if english else None):
            if c:
                out.setdefault(_path(u), set()).add(_norm(c))
    for page in truth["pages"].values():
        for ref in page.get("images", []):
            if ref.get("true_caption"):
                out.setdefault(_path(ref["url"]), set()).add(_norm(ref["true_caption"]))
    return out


def evaluate(shard_dir: str | Path, truth: dict[str, Any]) -> dict[str, Any]:
    images = {_path(u): v for u, v in truth["images"].items()}
    true_caps = true_captions(truth)
    kept = []
    for side in sorted(Path(shard_dir).glob("*.parquet")):
        columns = [c for c in ("url", "caption", "status", "candidates") if c in pq.read_schema(side).names]
        kept += [r for r in pq.read_table(side, columns=columns).to_pylist() if r["status"] == "success"]
    picture = {u: _path(v.get("duplicate_of") or u) for u, v in images.items()}
    caption_of: dict[str, set[str]] = {}  # true caption -> the pictures it describes
    for u, caps in true_caps.items():
        for c in caps:
            caption_of.setdefault(c, set()).add(picture.get(u, u))

    def own(u: str, text: str) -> bool:
        # A sentence that carries the true caption ("The photo above shows <caption>.") is right.
        return any(c == text or c in text for c in true_caps.get(u, ()))

    def other_picture(u: str, text: str) -> str | None:
        """Another picture whose true caption `text` is (or carries), when it is not `u`'s own."""
        if own(u, text):
            return None
        others = sorted(p for c, ps in caption_of.items() if c == text or c in text for p in ps if p != picture.get(u, u))
        return others[0] if others else None

    correct, canon, unwanted, wrong, foreign, foreign_cands = 0, {}, [], [], [], []
    for r in kept:
        u = _path(r["url"])
        info = images.get(u, {})
        cap = _norm(r["caption"])
        if own(u, cap):
            correct += 1
        else:
            wrong.append((u, r["caption"]))
            if (other := other_picture(u, cap)) is not None:
                foreign.append((u, r["caption"], other))
        for cand in r.get("candidates") or ():
            if (other := other_picture(u, _norm(cand["text"]))) is not None:
                foreign_cands.append((u, cand["text"], other))
        c = info.get("duplicate_of") or u
        canon[_path(c)] = canon.get(_path(c), 0) + 1
        if (info.get("reason") or "").startswith(HARD_REASONS):
            unwanted.append((u, info["reason"]))
    should = {u for u, v in images.items() if v.get("keep")}
    covered = should & set(canon)
    return {
        "kept": len(kept),
        "precision": correct / len(kept) if kept else 0.0,
        "wrong": len(wrong),  # samples whose caption is none of their picture's true captions
        "coverage": len(covered) / len(should) if should else 0.0,
        "should_keep": len(should),
        "duplicated": sorted(u for u, n in canon.items() if n > 1),
        "unwanted": unwanted,
        "wrong_captions": wrong[:20],
        "foreign_captions": foreign,
        "foreign_candidates": foreign_cands,
        "missing": sorted(should - covered)[:20],
    }


def evaluate_files(shard_dir: str | Path, truth_path: str | Path) -> dict[str, Any]:
    return evaluate(shard_dir, json.loads(Path(truth_path).read_text()))
