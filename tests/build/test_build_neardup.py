"""Near-duplicates need two agreeing signals: stage 4's embeddings and the pixels (phash).

Real COCO photos of ../shared/data scored by a weak scorer (a tiny randomly initialised
open_clip, whose embeddings of natural photos crowd together): its near-duplicate pairs join
distinct photos, and stage 5 must not merge them, or one photo is dropped and its caption may
become the other's. A resized, slightly brightened copy of one photo stays one sample.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from datetime import datetime, timezone

import pytest
from PIL import Image, ImageEnhance

pytest.importorskip("lait.scoring.pipeline")

from kit import scoring_data as testdata  # noqa: E402
from lait.build.config import BuildConfig  # noqa: E402
from lait.build.pipeline import build  # noqa: E402
from lait.filters.image_decode import decode_small, open_image  # noqa: E402
from lait.filters.image_stage import phash_of  # noqa: E402
from lait.parts import PartitionedWriter  # noqa: E402
from lait.scoring.config import ScoreConfig  # noqa: E402
from lait.scoring.pipeline import score_work  # noqa: E402
from lait.workdir import WorkDir

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SITE = "http://site.test"
N = 16


def _row(url: str, data: bytes) -> dict:
    header = open_image(data, max_pixels=10**8)
    return {"image_url": url, "page_url": f"{SITE}/p", "bytes": data, "mime": "image/jpeg", "status": 200,
            "fetched_at": T0, "width": header.width, "height": header.height, "format": header.format,
            "sha256": hashlib.sha256(data).hexdigest(), "phash": f"{phash_of(decode_small(header).image):016x}"}


def _write(work: WorkDir, table: str, rows: list[dict], key: str) -> None:
    with PartitionedWriter(work, "test") as parts:  # one part per partition of `key`
        for r in rows:
            parts.write(table, parts.partition_of(r[key]), r)


def test_distinct_real_photos_close_in_a_weak_scorer_are_not_merged(shared_data, tmp_path):
    coco = shared_data / "photos" / "coco_train"
    meta = json.loads((coco / "captions.json").read_text())
    captions: dict[int, list[str]] = {}
    for ann in meta["annotations"]:
        captions.setdefault(ann["image_id"], []).append(ann["caption"].strip())
    photos = sorted((im["file_name"], im["id"]) for im in meta["images"] if (coco / im["file_name"]).exists())[:N]
    work = WorkDir(tmp_path / "work", n_partitions=2).init()
    ok, cands, photo_of = [], [], {}
    for i, (name, image_id) in enumerate(photos):
        url = f"{SITE}/img/{name}"
        ok.append(_row(url, (coco / name).read_bytes()))
        cands.append({"page_url": f"{SITE}/a/{i}.html", "image_url": url,
                      "texts": [{"text": captions[image_id][0], "source": "figcaption", "lang": "en"}]})
        photo_of[url] = image_id
    # The same photo again, resized and a little brighter, on another page with another caption.
    name, image_id = photos[0]
    with Image.open(coco / name) as im:
        copy = ImageEnhance.Brightness(im.convert("RGB").resize((im.width * 3 // 4, im.height * 3 // 4))).enhance(1.08)
    buf = io.BytesIO()
    copy.save(buf, "JPEG", quality=80)
    copy_url = f"{SITE}/copies/{name}"
    ok.append(_row(copy_url, buf.getvalue()))
    cands.append({"page_url": f"{SITE}/b/0.html", "image_url": copy_url,
                  "texts": [{"text": captions[image_id][1], "source": "alt", "lang": "en"}]})
    photo_of[copy_url] = image_id
    _write(work, "images_ok", ok, "image_url")
    _write(work, "candidates", cands, "image_url")

    cfg = ScoreConfig(work=str(work.root), model_config=str(testdata.tiny_config_file(tmp_path)),
                      allow_random_init=True, batch_size=8, loader_workers=0, fast_decode=False, progress=False,
                      near_dup_threshold=0.95)
    assert score_work(cfg).ok
    pairs = [(r["image_url_a"], r["image_url_b"]) for r in work.iter_rows("near_dups")]
    distinct = [(a, b) for a, b in pairs if photo_of[a] != photo_of[b]]
    assert len(distinct) >= N, f"the weak scorer should crowd distinct photos: {len(distinct)} pairs"

    assert build(BuildConfig(work=str(work.root), workers=1, progress=False)).ok
    dropped = {r["image_url"]: r["reason"] for r in work.iter_rows("rejected") if r["reason"].startswith("build/")}
    samples = []
    for tar in sorted((work.root / "shards").glob("*.tar")):
        with tarfile.open(tar) as tf:
            samples += [json.loads(tf.extractfile(m).read()) for m in tf.getmembers() if m.name.endswith(".json")]
    # Every distinct photo is a sample, captioned with one of its own captions.
    assert {photo_of[s["url"]] for s in samples} == {image_id for _, image_id in photos}
    assert len(samples) == N
    for s in samples:
        assert s["caption"] in captions[photo_of[s["url"]]], s
        assert all(c["text"] in captions[photo_of[s["url"]]] for c in s["candidates"]), s
    # The copy is merged into its original (by the phash alone, or by embedding and phash).
    assert dropped == {copy_url: dropped.get(copy_url)} and dropped[copy_url] in (
        "build/duplicate_phash", "build/near_duplicate")
