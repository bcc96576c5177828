"""A text moves to another image of a duplicate group only scored against that image, and only
pixels that agree make a group (kit.build_data writes the tables stage 5 reads)."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow.parquet as pq
import pytest

from kit import build_data as data
from lait.build.config import BuildConfig
from lait.build.dedup import group_duplicates
from lait.build.pipeline import build
from lait.build.pixels import pixel_diff, thumbnail
from lait.workdir import WorkDir, partition_of

SITE = data.SITE


def _text_at(image: np.ndarray, cosine: float, seed: str) -> np.ndarray:
    """A unit text embedding whose cosine with `image` is `cosine`."""
    other = data.unit_vector(seed).astype(np.float64)
    other -= other @ image * image
    other /= np.linalg.norm(other)
    return (cosine * image + np.sqrt(1 - cosine**2) * other).astype(np.float16)


def _write(work: WorkDir, table: str, rows: list[dict]) -> None:
    writers = {}
    for r in rows:
        r = dict(r)
        p = partition_of(r.pop("_image_url", None) or r["image_url"], work.n_partitions)
        if p not in writers:
            writers[p] = work.writer(table, p, "input")
        writers[p].write(r)
    for w in writers.values():
        w.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """a: a photo, a2: its smaller re-encode, whose page has two texts stage 4 scored against a2
    (0.2 and 0.95) but that score 0.6 and 0.05 against a; b: another picture whose perceptual
    hash collides with a's (simple pictures do), with a text that would win on a; c and its
    re-encode c2, whose text has no stored embedding."""
    root = tmp_path_factory.mktemp("work")
    work = WorkDir(root, n_partitions=4).init()
    urls = {k: f"{SITE}/img/{k}.jpg" for k in ("a", "a2", "b", "c", "c2")}
    ok = {"a": data._ok_row(urls["a"], data.photo(1)), "a2": data._ok_row(urls["a2"], data.photo(1, (320, 256))),
          "b": data._ok_row(urls["b"], data.photo(2)), "c": data._ok_row(urls["c"], data.photo(3)),
          "c2": data._ok_row(urls["c2"], data.photo(3, (320, 256)))}
    ok["b"]["phash"] = ok["a"]["phash"]
    page = f"{SITE}/a.html"
    scored = [data._pair(urls["a"], page, "caption of a", "figcaption", 0.30),
              data._pair(urls["a2"], f"{SITE}/a2.html", "a better caption of a", "alt", 0.2),
              data._pair(urls["a2"], f"{SITE}/a2.html", "a text that fits a2 only", "title", 0.95),
              data._pair(urls["b"], f"{SITE}/b.html", "caption of b", "alt", 0.99),
              data._pair(urls["c"], f"{SITE}/c.html", "caption of c", "alt", 0.4),
              data._pair(urls["c2"], f"{SITE}/c2.html", "a text without embedding", "alt", 0.9)]
    image = {k: data.image_vector(r["sha256"]) for k, r in ok.items()}
    a = image["a"].astype(np.float64) / np.linalg.norm(image["a"].astype(np.float64))
    text = {"caption of a": _text_at(a, 0.3, "1"), "a better caption of a": _text_at(a, 0.6, "2"),
            "a text that fits a2 only": _text_at(a, 0.05, "3"), "caption of b": _text_at(a, 0.99, "4"),
            "caption of c": data.unit_vector("5")}
    _write(work, "images_ok", list(ok.values()))
    _write(work, "scored", scored)
    _write(work, "image_embs", [{"image_url": urls[k], "sha256": r["sha256"], "dim": data.EMB_DIM,
                                 "emb": image[k].tobytes()} for k, r in ok.items()])
    _write(work, "text_embs", [{"_image_url": r["image_url"], "text": r["text"], "dim": data.EMB_DIM,
                                "emb": text[r["text"]].tobytes()} for r in scored if r["text"] in text])
    result = build(BuildConfig(work=str(root), workers=1, progress=False, samples_per_shard=16))
    assert result.ok
    side = [r for p in sorted((root / "shards").glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    samples = {r["url"]: r for r in side if r["status"] == "success"}
    dropped = {r["image_url"]: r["reason"] for r in work.iter_rows("rejected") if r["reason"].startswith("build/")}
    return urls, samples, dropped, result.stats["counters"]


def test_a_moved_text_carries_its_score_against_the_kept_image(built):
    urls, samples, dropped, counters = built
    a = samples[urls["a"]]
    assert a["urls"] == [urls["a"], urls["a2"]] and dropped[urls["a2"]] == "build/duplicate_phash"
    assert a["caption"] == "a better caption of a" and a["score"] == pytest.approx(0.6, abs=0.01)
    scores = {c["text"]: c["score"] for c in a["candidates"]}
    assert scores["a text that fits a2 only"] == pytest.approx(0.05, abs=0.01)  # not a2's 0.95
    assert scores["caption of a"] == pytest.approx(0.30)  # a's own text keeps stage 4's score
    assert counters["build/texts_rescored"] == 2


def test_a_text_without_embeddings_does_not_move(built):
    urls, samples, dropped, counters = built
    c = samples[urls["c"]]
    assert dropped[urls["c2"]] == "build/duplicate_phash"
    assert c["caption"] == "caption of c" and [x["text"] for x in c["candidates"]] == ["caption of c"]
    assert counters["build/texts_not_moved"] == 1


def test_a_phash_collision_of_distinct_pictures_is_not_a_group(built):
    urls, samples, dropped, _ = built
    assert urls["b"] not in dropped
    assert samples[urls["b"]]["caption"] == "caption of b" and samples[urls["b"]]["urls"] == [urls["b"]]
    assert all(c["text"] != "caption of b" for c in samples[urls["a"]]["candidates"])


class Thumbs:
    """A `SamePicture` over given thumbnails, counting the checks."""

    def __init__(self, thumbs: list[np.ndarray], max_diff: float = 24.0):
        self.thumbs, self.max_diff, self.checks = thumbs, max_diff, 0

    def load(self, indices) -> None:
        pass

    def same(self, a: int, b: int) -> bool:
        self.checks += 1
        return pixel_diff(self.thumbs[a], self.thumbs[b]) <= self.max_diff


def test_equal_hashes_of_many_copies_cost_linear_checks():
    """A thousand re-encodes of one picture under one phash, plus one distinct picture with the
    same hash: two groups, about a thousand checks."""
    one, other = thumbnail(data.photo(7)), thumbnail(data.photo(8))
    thumbs = [np.clip(one.astype(np.int16) + i % 3, 0, 255).astype(np.uint8) for i in range(1000)] + [other]
    check = Thumbs(thumbs)
    groups = group_duplicates([hashlib.sha256(str(i).encode()).hexdigest() for i in range(1001)], [5] * 1001, 2,
                              check=check)
    assert sorted(map(len, groups)) == [1, 1000]
    assert check.checks <= 1001
    # Without a check the hash alone groups them all (what the pixel check is there for).
    assert len(group_duplicates([str(i) for i in range(1001)], [5] * 1001, 2)) == 1


def test_pixel_check_joins_copies_of_real_photos_and_nothing_else(shared_data):
    """Resized, recompressed and brightened copies of real photos pass the default check; no two
    distinct photos do (measured over 3,087 real photos: no distinct pair within 36 of each other)."""
    import io

    from PIL import Image, ImageEnhance

    limit = BuildConfig.near_dup_max_diff
    photos = sorted((shared_data / "photos" / "coco_train").glob("*.jpg"))[:12]
    thumbs = [thumbnail(p.read_bytes()) for p in photos]

    def jpeg(im, quality: int) -> bytes:
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=quality)
        return buf.getvalue()

    for path, t in zip(photos, thumbs):
        with Image.open(path) as im:
            im = im.convert("RGB")
            w, h = im.size
            copies = [jpeg(im.resize((w // 2, h // 2), Image.Resampling.LANCZOS), 85),
                      jpeg(im.resize((round(w * 0.92), round(h * 0.92))), 72), jpeg(im, 50),
                      jpeg(ImageEnhance.Brightness(im.resize((w * 3 // 4, h * 3 // 4))).enhance(1.08), 80)]
        assert all(pixel_diff(t, thumbnail(c)) <= limit for c in copies), path.name
    for i, a in enumerate(thumbs):
        for b in thumbs[i + 1:]:
            assert pixel_diff(a, b) > limit
