"""A small work directory with `images_ok/` and `scored/` written directly, for stage 5 tests.

Every rule of `lait build` has its case here, and `EXPECT` says what a correct build does.
"""

from __future__ import annotations

import hashlib
import io
import random
from datetime import datetime, timezone

import numpy as np
from PIL import Image

from lait.workdir import WorkDir, partition_of

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SITE = "http://site.test"
N_PHOTOS = 40
GENERIC = "Click to enlarge"
BEST_OF_3 = "the best caption of grid three"


def photo(i: int, size: tuple[int, int] = (400, 320), fmt: str = "JPEG") -> bytes:
    """A distinct picture per i: a coarse random grid (distinct perceptual hashes), scaled up."""
    rng = random.Random(i)
    small = Image.new("RGB", (8, 6))
    small.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256)) for _ in range(48)])
    img = small.resize(size, Image.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def caption(i: int) -> str:
    return f"a photo of grid number {i} in warm and cold colours"


def _ok_row(url: str, data: bytes, fmt: str | None = None) -> dict:
    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h, f = im.width, im.height, im.format
            import imagehash  # a test dependency (the dev extra): the reference phash

            ph = str(imagehash.phash(im))
    except Exception:
        w, h, f, ph = 400, 400, fmt or "PNG", "0" * 16
    return {"image_url": url, "page_url": f"{SITE}/", "bytes": data, "mime": "image/jpeg", "status": 200,
            "fetched_at": T0, "width": w, "height": h, "format": fmt or f,
            "sha256": hashlib.sha256(data).hexdigest(), "phash": ph}


def _pair(url: str, page: str, text: str, source: str, score: float) -> dict:
    return {"image_url": url, "page_url": page, "text": text, "source": source, "lang": "en",
            "score": score, "model": "test", "pretrained": None, "image_emb_ref": None, "text_emb_ref": None}


def make_work(root, n_partitions: int = 4, embeddings: bool = False) -> tuple[WorkDir, dict]:
    """Write the work directory; returns it and the expected outcome per image URL. With
    `embeddings`, also `image_embs/` and `text_embs/` as stage 4 lays them out (random unit
    vectors, one per image URL and one per distinct text of a partition)."""
    work = WorkDir(root, n_partitions=n_partitions).init()
    ok: list[dict] = []
    scored: list[dict] = []
    expect: dict[str, str] = {}  # url -> caption it must carry, or "build/RULE" of its drop
    for i in range(N_PHOTOS):
        url, page = f"{SITE}/img/photo{i}.jpg", f"{SITE}/a/{i}.html"
        ok.append(_ok_row(url, photo(i)))
        scored += [_pair(url, page, caption(i), "figcaption", 0.30 + i / 1000),
                   _pair(url, page, f"The story of page {i} goes on here.", "context", 0.20),
                   _pair(url, page, f"grid {i}", "alt", 0.25)]
        if i < 12:  # boilerplate scoring higher than the true caption: dropped as generic
            scored.append(_pair(url, page, GENERIC, "title", 0.9))
        expect[url] = caption(i)
    # Ties on score: the figcaption wins over the alt.
    scored.append(_pair(f"{SITE}/img/photo7.jpg", f"{SITE}/a/7.html", "grid seven", "alt", 0.307))
    # The same bytes under another URL, on another page, with a better text: one sample whose
    # caption is the best text pooled over both copies.
    copy = f"{SITE}/img/copy3.jpg"
    ok.append(_ok_row(copy, photo(3)))
    scored.append(_pair(copy, f"{SITE}/b/3.html", BEST_OF_3, "alt", 0.5))
    expect[f"{SITE}/img/photo3.jpg"] = BEST_OF_3
    expect[copy] = "build/duplicate_sha256"
    # A resized re-encode (smaller): the larger original is kept.
    small = f"{SITE}/img/small5.jpg"
    ok.append(_ok_row(small, photo(5, (320, 256))))
    scored.append(_pair(small, f"{SITE}/b/5.html", caption(5), "alt", 0.31))
    expect[small] = "build/duplicate_phash"
    # The site logo on 60 pages, always with the same alt.
    logo = f"{SITE}/static/logo.png"
    ok.append(_ok_row(logo, photo(1000, (400, 400), "PNG")))
    scored += [_pair(logo, f"{SITE}/a/{p}.html", "Shapes Daily logo", "alt", 0.33) for p in range(60)]
    expect[logo] = "build/too_many_pages"
    # A banner with many different texts.
    banner = f"{SITE}/static/banner.jpg"
    ok.append(_ok_row(banner, photo(1001)))
    scored += [_pair(banner, f"{SITE}/a/{p}.html", f"special offer number {p}", "alt", 0.31) for p in range(20)]
    expect[banner] = "build/too_many_texts"
    # Only boilerplate text.
    only_generic = f"{SITE}/img/generic.jpg"
    ok.append(_ok_row(only_generic, photo(1002)))
    scored.append(_pair(only_generic, f"{SITE}/c.html", GENERIC, "alt", 0.4))
    expect[only_generic] = "build/generic_texts"
    # A weak pair (below min_score 0.1 in the tests that set it).
    weak = f"{SITE}/img/weak.jpg"
    ok.append(_ok_row(weak, photo(1003)))
    scored.append(_pair(weak, f"{SITE}/d.html", "an unrelated sentence", "context", 0.05))
    expect[weak] = "an unrelated sentence"
    # A PNG photo: re-encoded to KEY.jpg.
    png = f"{SITE}/img/photo.png"
    ok.append(_ok_row(png, photo(1004, fmt="PNG")))
    scored.append(_pair(png, f"{SITE}/e.html", "a lossless grid", "figcaption", 0.35))
    expect[png] = "a lossless grid"
    # Bytes that claim to be a PNG but are not: recorded when the shard is written.
    broken = f"{SITE}/img/broken.png"
    ok.append(_ok_row(broken, b"\x89PNG\r\n\x1a\n this is not an image", "PNG"))
    scored.append(_pair(broken, f"{SITE}/e.html", "a broken grid", "alt", 0.3))
    expect[broken] = "build/unreadable"
    # Scored texts for an image that has no images_ok row.
    ghost = f"{SITE}/img/ghost.jpg"
    scored.append(_pair(ghost, f"{SITE}/e.html", "a ghost", "alt", 0.3))
    expect[ghost] = "build/no_image"

    tables = [("images_ok", ok), ("scored", scored)]
    if embeddings:
        tables += embedding_rows(ok, scored, n_partitions)
    for table, rows in tables:
        writers = {}
        for r in rows:
            r = dict(r)
            p = partition_of(r.pop("_image_url", None) or r["image_url"], n_partitions)
            if p not in writers:
                writers[p] = work.writer(table, p, "input")
            writers[p].write(r)
        for w in writers.values():
            w.close()
    return work, expect


EMB_DIM = 16


def make_built_work(root, samples_per_shard: int = 16):
    """`make_work(root, embeddings=True)` built by `lait build` (one worker, 16 samples a shard)."""
    from lait.build.config import BuildConfig
    from lait.build.pipeline import build

    make_work(root, embeddings=True)
    assert build(BuildConfig(work=str(root), workers=1, progress=False, samples_per_shard=samples_per_shard)).ok
    return root


def unit_vector(seed: str) -> np.ndarray:
    rng = np.random.default_rng(int(hashlib.sha256(seed.encode()).hexdigest()[:8], 16))
    v = rng.standard_normal(EMB_DIM)
    return (v / np.linalg.norm(v)).astype(np.float16)


def image_vector(sha256: str) -> np.ndarray:
    """Stage 4 encodes the same bytes to the same embedding, whatever their URL."""
    return unit_vector("image:" + sha256)


def text_vector(text: str) -> np.ndarray:
    # The best caption of photo 3 (found beside its copy) describes it: its embedding is the
    # picture's, so scored against photo 3 it still wins.
    if text == BEST_OF_3:
        return image_vector(hashlib.sha256(photo(3)).hexdigest())
    return unit_vector("text:" + text)


def embedding_rows(ok: list[dict], scored: list[dict], n_partitions: int) -> list[tuple[str, list[dict]]]:
    """image_embs/ and text_embs/ rows; a text row's `_image_url` only says its partition."""
    images = [{"image_url": r["image_url"], "sha256": r["sha256"], "dim": EMB_DIM,
               "emb": image_vector(r["sha256"]).tobytes()} for r in ok]
    texts, seen = [], set()
    for r in scored:
        p = partition_of(r["image_url"], n_partitions)
        if (p, r["text"]) not in seen:
            seen.add((p, r["text"]))
            texts.append({"_image_url": r["image_url"], "text": r["text"], "dim": EMB_DIM,
                          "emb": text_vector(r["text"]).tobytes()})
    return [("image_embs", images), ("text_embs", texts)]
