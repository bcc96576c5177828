"""PartsPipeline: the rows waiting in open parts stay under one shared limit, and none is lost."""

from __future__ import annotations

import hashlib

import pyarrow.parquet as pq

from lait.crawler.items import ImageItem, PageItem
from lait.crawler.pipelines import PartsPipeline
from lait.workdir import WorkDir


class _Stats:
    def __init__(self):
        self.values: dict[str, int] = {}

    def inc_value(self, name: str) -> None:
        self.values[name] = self.values.get(name, 0) + 1


def _image(i: int) -> ImageItem:
    body = hashlib.sha256(str(i).encode()).digest() * 1600  # ~50 KB, distinct per image
    return ImageItem(image_url=f"http://cdn.test/{i}.jpg", status=200, bytes=body, mime="image/jpeg",
                     page_url=f"http://site.test/{i // 4}.html")


def test_open_parts_buffer_at_most_the_shared_limit(tmp_path):
    limit = 1 << 20
    stats = _Stats()
    pipe = PartsPipeline(str(tmp_path / "w"), 8, part_rows=2000, part_bytes=128 << 20,
                         part_seconds=3600, stats=stats, buffer_bytes=limit)
    pipe.open_spider()
    items = [_image(i) for i in range(300)]
    largest_row = max(len(it.bytes) + len(it.image_url) + len(it.page_url) + len(it.mime) for it in items)
    for n, item in enumerate(items):
        pipe.process_item(item)
        pipe.process_item(PageItem(url=f"http://site.test/{n}.html", status=200, html=b"<html>" * 100))
        buffered = pipe.parts.buffered_bytes
        assert buffered <= limit + largest_row
    # 300 x 50 KB went through 8 open parts (no part reached its row or byte limit): without the
    # shared limit all of it would have waited in memory until the commit.
    assert stats.values["crawl/buffer_flushes"] > 0
    pipe.close_spider()

    work = WorkDir(tmp_path / "w")
    rows = work.read("images").to_pylist()
    assert sorted(r["image_url"] for r in rows) == sorted(it.image_url for it in items)
    by_url = {it.image_url: it.bytes for it in items}
    assert all(r["bytes"] == by_url[r["image_url"]] for r in rows)
    assert work.count("pages") == 300
    # Still one part per (table, partition): the early flushes became row groups, not files.
    parts = work.part_files("images")
    assert len(parts) == 8
    assert sum(pq.ParquetFile(str(p)).num_row_groups for p in parts) > len(parts)


def test_no_flush_below_the_limit(tmp_path):
    stats = _Stats()
    pipe = PartsPipeline(str(tmp_path / "w"), 4, part_rows=2000, part_bytes=128 << 20,
                         part_seconds=3600, stats=stats, buffer_bytes=64 << 20)
    pipe.open_spider()
    for i in range(40):
        pipe.process_item(_image(i))
    assert "crawl/buffer_flushes" not in stats.values
    pipe.close_spider()
    parts = WorkDir(tmp_path / "w").part_files("images")
    assert all(pq.ParquetFile(str(p)).num_row_groups == 1 for p in parts)
