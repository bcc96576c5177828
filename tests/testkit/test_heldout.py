"""The demo web's held-out evaluation set (`lait.testkit.heldout`): another seed's photos, each with
its true caption, drawn apart from the crawled site."""

from __future__ import annotations

import hashlib
import json

from lait.testkit.generator import generate_site
from lait.testkit.heldout import write_heldout_set


def test_the_heldout_set_holds_another_seeds_kept_photos_with_their_true_captions(tmp_path):
    path = write_heldout_set(tmp_path / "eval", pages=8, seed=1)
    items = json.loads(path.read_text())["images"]
    truth = generate_site(8, 1).ground_truth()["images"]
    kept = {u for u, v in truth.items() if v["keep"] and v["true_caption"] and v["format"] == "JPEG"}
    assert {it["url"] for it in items} == kept and len(items) >= 8
    for it in items:
        assert it["split"] == "test" and it["sentences"] == [{"raw": truth[it["url"]]["true_caption"]}]
        assert (tmp_path / "eval" / it["filepath"] / it["filename"]).read_bytes()[:3] == b"\xff\xd8\xff"  # a JPEG
    # Another seed draws other pictures: none byte for byte the crawled site's (seed 0) here; near-copies of
    # the simplest scenes can occur in larger sites, and lait compare drops those with --exclude-eval.
    crawled = write_heldout_set(tmp_path / "seed0", pages=8, seed=0)
    digests = {hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "eval" / "images").iterdir()}
    seen = {hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "seed0" / "images").iterdir()}
    assert crawled.is_file() and seen and not digests & seen
    # Asked again with the same settings, the set is kept as it is.
    before = path.stat().st_mtime_ns
    assert write_heldout_set(tmp_path / "eval", pages=8, seed=1) == path and path.stat().st_mtime_ns == before
