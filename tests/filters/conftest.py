"""Helpers for the stage 2 and 3 tests: work directories written directly, test images."""

from __future__ import annotations

import io
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from lait.workdir import WorkDir, partition_of

NOW = datetime(2024, 5, 1, tzinfo=timezone.utc)


def photo(seed: int, w: int = 480, h: int = 360) -> Image.Image:
    """A photo-like RGB image: a smooth random colour field plus sensor noise."""
    rs = np.random.default_rng(seed)
    coarse = Image.fromarray(rs.integers(0, 256, (6, 6, 3), dtype=np.uint8), "RGB")
    arr = np.asarray(coarse.resize((w, h), Image.Resampling.BICUBIC), np.float32)
    arr += rs.normal(0, 6, (h, w, 3))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")


def encode(img: Image.Image, fmt: str = "JPEG", **kw: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def image_row(url: str, data: bytes | None, *, status: int = 200, mime: str = "image/jpeg",
              page_url: str = "http://site.test/page.html") -> dict[str, Any]:
    return {"image_url": url, "page_url": page_url, "bytes": data, "mime": mime, "status": status,
            "fetched_at": NOW, "error": None}


def page_row(url: str, html: str | bytes, *, status: int = 200,
             content_type: str = "text/html; charset=utf-8") -> dict[str, Any]:
    body = html.encode() if isinstance(html, str) else html
    return {"url": url, "status": status, "fetched_at": NOW, "headers": {"Content-Type": content_type},
            "content_type": content_type, "html": body, "encoding": None, "depth": 0,
            "referer": None, "error": None}


def write_table(work: WorkDir, table: str, rows: list[dict[str, Any]], key: str) -> None:
    """Write rows partitioned by `key` the way the crawler does (one part per partition)."""
    by_part: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_part.setdefault(partition_of(row[key], work.n_partitions), []).append(row)
    for p, part_rows in by_part.items():
        w = work.writer(table, p, "test")
        w.write_many(part_rows)
        w.close()


@pytest.fixture
def make_work(tmp_path: Path):
    def make(n_partitions: int = 1, name: str = "work") -> WorkDir:
        return WorkDir(tmp_path / name, n_partitions=n_partitions).init()
    return make


def rejected_by_url(work: WorkDir) -> dict[str, str]:
    return {r["image_url"]: r["reason"] for r in work.iter_rows("rejected") if r["image_url"]}


@pytest.fixture
def td():
    """This module's helpers (test files cannot import a conftest by name under importlib mode)."""
    import sys

    return sys.modules[__name__]
