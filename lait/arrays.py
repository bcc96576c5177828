"""Arrays kept in table columns: stage 4 writes them, stage 5 and the trainer read them.

Arrays are stored as raw little-endian bytes with their shape in plain columns: Arrow has no
convenient fp16 list type, and raw bytes decode with `np.frombuffer` without any pickle.

| table | one row per | columns |
|---|---|---|
| `image_embs/` | scored image | image_url, sha256, dim, emb (fp16 x dim, L2-normalised) |
| `text_embs/` | distinct text of a partition | text, dim, emb (fp16 x dim, L2-normalised) |
| `regions/` | image (with `--regions`) | image_url, n, dim, features (fp16 n x dim), boxes (fp32 n x 4: x1,y1,x2,y2 in [0, 1]) |
| `region_labels/` | image (with `--regions`) | image_url, n, labels (int32 n: nearest codebook centroid) |
| `near_dups/` | near-duplicate image pair | image_url_a < image_url_b, cosine |

`scored.image_emb_ref` / `text_emb_ref` are row indices into the `image_embs/` / `text_embs/`
rows of the same partition (read in part order, as `WorkDir.read` does). All of them are
partitioned by image URL like `scored/`; `near_dups/` by `image_url_a`. The schemas are in `lait.schemas`; the codebook itself is
`WORK/score_codebook/centroids.npy` (fp32 K x dim) with `codebook.json` beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lait.workdir import WorkDir

# Region geometry shared by stage 4 and the trainer: cells of a feature grid and their boxes.


def cell_grid(grid_h: int, grid_w: int, max_regions: int) -> tuple[int, int]:
    """The largest grid of at most `max_regions` cells with the patch grid's aspect ratio."""
    if grid_h * grid_w <= max_regions:
        return grid_h, grid_w
    scale = math.sqrt(max_regions / (grid_h * grid_w))
    rows, cols = max(1, int(grid_h * scale)), max(1, int(grid_w * scale))
    while rows * cols > max_regions:  # rounding guard
        if rows >= cols:
            rows -= 1
        else:
            cols -= 1
    return rows, cols


def grid_boxes(rows: int, cols: int) -> np.ndarray:
    """Normalised x1, y1, x2, y2 of every cell of a rows x cols grid, row-major (fp32)."""
    ys, xs = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    boxes = np.stack([xs / cols, ys / rows, (xs + 1) / cols, (ys + 1) / rows], -1)
    return boxes.reshape(-1, 4).astype(np.float32)


def to_bytes(a: np.ndarray, dtype: str) -> bytes:
    return np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()


def stack_embs(table: pa.Table) -> np.ndarray:
    """All embeddings of an `image_embs`/`text_embs` Arrow table as one fp16 (rows x dim) array."""
    if table.num_rows == 0:
        return np.zeros((0, 0), np.float16)
    dim = table.column("dim")[0].as_py()
    data = b"".join(v.as_py() for v in table.column("emb"))
    return np.frombuffer(data, "<f2").reshape(table.num_rows, dim)


@dataclass(frozen=True)
class RegionArrays:
    """One image's region tokens as stage 5 writes them: KEY.regions/boxes/labels.npy."""

    features: np.ndarray  # fp16 (n, dim)
    boxes: np.ndarray     # fp32 (n, 4), normalised x1, y1, x2, y2
    labels: np.ndarray | None  # int32 (n,), codebook ids; None before the codebook exists


def region_arrays(row: dict[str, Any], labels_row: dict[str, Any] | None = None) -> RegionArrays:
    n, dim = row["n"], row["dim"]
    labels = None if labels_row is None else np.frombuffer(labels_row["labels"], "<i4").reshape(n)
    return RegionArrays(np.frombuffer(row["features"], "<f2").reshape(n, dim),
                        np.frombuffer(row["boxes"], "<f4").reshape(n, 4), labels)


def load_regions(work: WorkDir, partition: int) -> dict[str, RegionArrays]:
    """Region arrays of one partition by image URL (with labels when they were computed)."""
    labels = {r["image_url"]: r for r in work.iter_rows("region_labels", partition)}
    return {r["image_url"]: region_arrays(r, labels.get(r["image_url"])) for r in work.iter_rows("regions", partition)}
