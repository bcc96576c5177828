"""Issue 59, item 1: every image format the web serves reaches the shards.

Stage 2 stores a PNG, WebP, BMP, TIFF or CMYK JPEG as a JPEG. It used to record the SHA-256 of
the file as fetched beside the re-encoded bytes, so `lait build` took every such image for
corrupt (`build/corrupt_image`), `lait verify` called its part damaged and `--repair` wrote the
same mismatch again: the built-in web serves only JPEGs, so no test saw it. Here real COCO
photos are saved in each format and served from loopback, reached once through a URL list
(`lait download`) and once through a crawl of a page that shows them (`lait crawl`); both work
directories go through `lait run` to shards, and each photo must be a sample whose `sha256` is
the digest of the bytes in its tar and whose `fetched_sha256` is the served file's.
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from kit.photos import PhotoServer, PhotoSite, coco_photos
from kit.pipeline_kit import write_csv
from lait.workdir import WorkDir

PIPELINE = "clean: {languages: [en]}\nscore: {model: demo, near_dup_threshold: 0.999}\nbuild: {samples_per_shard: 20}\n"
# Pillow's name of the format, the file suffix, and how the photo is saved in it.
FORMATS = {
    "PNG": ".png", "WEBP": ".webp", "BMP": ".bmp", "TIFF": ".tif", "CMYK": ".jpg", "JPEG": ".jpg",
}


def lait(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lait", *argv], capture_output=True, text=True, timeout=timeout)


def saved_as(photo: Path, kind: str) -> bytes:
    """The photo's pixels as a file of `kind` (the JPEG one is the photo's own bytes)."""
    from PIL import Image

    if kind == "JPEG":
        return photo.read_bytes()
    buf = io.BytesIO()
    with Image.open(photo) as im:
        if kind == "CMYK":
            im.convert("CMYK").save(buf, "JPEG", quality=92)
        elif kind == "WEBP":
            im.save(buf, "WEBP", quality=90)
        elif kind == "TIFF":
            im.save(buf, "TIFF", compression="tiff_deflate")
        else:
            im.save(buf, kind)
    return buf.getvalue()


def shard_samples(work: Path) -> dict[str, tuple[dict, bytes]]:
    """url -> (KEY.json, the image member's bytes) of every sample in work/shards."""
    out = {}
    for tar in sorted((work / "shards").glob("*.tar")):
        with tarfile.open(tar) as tf:
            members = {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}
        for name, body in members.items():
            if name.endswith(".json"):
                sample = json.loads(body)
                (image,) = [b for n, b in members.items() if n.rsplit(".", 1)[0] == name[:-5]
                            and n.rsplit(".", 1)[1] in ("jpg", "png", "webp")]
                out[sample["url"]] = (sample, image)
    return out


@pytest.fixture(scope="module")
def served(shared_data):
    """Twelve COCO photos, two of each format (one for the list, one for the crawl), with their
    first human caption, served from one loopback host beside a page that shows the crawl's six."""
    from PIL import Image

    photos = [(p, c) for p, c in coco_photos(shared_data / "photos" / "coco_train")
              if min(Image.open(p).size) >= 300][:2 * len(FORMATS)]
    assert len(photos) == 2 * len(FORMATS)
    files, listed, shown = {}, [], []
    for i, (kind, suffix) in enumerate(FORMATS.items()):
        for source, (photo, caption) in zip((listed, shown), photos[2 * i:2 * i + 2]):
            path = f"/photos/{kind.lower()}-{photo.stem}{suffix}"
            files[path] = saved_as(photo, kind)
            source.append((kind, path, caption))
    figures = "".join(f'<figure><img src="{p}" alt="{html.escape(c)}"><figcaption>{html.escape(c)}</figcaption>'
                      f"</figure>" for _, p, c in shown)
    files["/index.html"] = (f"<!doctype html><html lang=en><head><title>Photos in every format</title></head>"
                            f"<body><h1>Photos in every format</h1>{figures}</body></html>").encode()
    server = PhotoServer(PhotoSite(files), host="127.0.59.1").start()
    yield server, files, listed, shown
    server.close()


def check_shards(work: Path, server, files: dict[str, bytes], expected: list[tuple[str, str, str]]) -> None:
    samples = shard_samples(work)
    rejected = WorkDir(work).read("rejected").to_pylist()
    for kind, path, caption in expected:
        url = server.url + path
        why = sorted({r["reason"] + ": " + (r["detail"] or "") for r in rejected if r["image_url"] == url})
        assert url in samples, f"{kind} {url}: no sample ({why})"
        sample, image = samples[url]
        if sample["source"] == "list":
            assert sample["caption"] == caption
        else:  # the crawl's page: its figcaption or alt text, as stage 3 cleaned it
            assert sample["page_url"] == server.url + "/index.html" and sample["source"] in ("figcaption", "alt")
        assert sample["sha256"] == hashlib.sha256(image).hexdigest(), kind  # what a reader checks
        assert sample["fetched_sha256"] == hashlib.sha256(files[path]).hexdigest(), kind
        assert sample["original_format"] == ("JPEG" if kind == "CMYK" else kind)
        if kind == "JPEG" and not sample["face_bboxes"]:
            assert image == files[path] and sample["sha256"] == sample["fetched_sha256"]  # shipped as it came
        else:
            assert image[:3] == b"\xff\xd8\xff"  # a JPEG shard: the stored JPEG, not a second encode
    assert not [r for r in rejected if r["reason"] == "build/corrupt_image"]
    done = lait("verify", str(work))
    assert done.returncode == 0 and "damaged" not in done.stdout + done.stderr, done.stdout + done.stderr


def run_pipeline(work: Path, tmp_path: Path) -> None:
    """`lait run` to shards, stage 2 without its face and unsafe models: the formats are what
    is tested here (a blurred face's digest is checked by tests/crawler/download/test_download.py)."""
    (tmp_path / "pipeline.yaml").write_text(PIPELINE.replace("build: {", "build: {face_model: none, ") + "filter: {unsafe_model: none}\n")
    done = lait("run", str(work), "--config", str(tmp_path / "pipeline.yaml"), "--workers", "1", "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]


def test_every_format_from_a_url_list_reaches_the_shards(served, tmp_path):
    server, files, listed, _ = served
    rows = [{"url": server.url + path, "caption": caption} for _, path, caption in listed]
    work = tmp_path / "W"
    done = lait("download", str(write_csv(tmp_path / "photos.csv", rows)), "--out", str(work), "--allow-loopback",
                "--no-autothrottle", "--log-level", "WARNING", "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    run_pipeline(work, tmp_path)
    check_shards(work, server, files, listed)


def test_every_format_from_a_crawl_reaches_the_shards(served, tmp_path):
    server, files, _, shown = served
    work = tmp_path / "W"
    done = lait("crawl", "--seeds", server.url + "/index.html", "--out", str(work), "--allow-loopback",
                "--no-autothrottle", "--log-level", "WARNING", "-q")
    assert done.returncode == 0, done.stderr[-3000:]
    run_pipeline(work, tmp_path)
    check_shards(work, server, files, shown)
