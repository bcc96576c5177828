"""Region features from stage 4, written into shards as `KEY.regions.npy` (fp16, n x dim),
`KEY.boxes.npy` (fp32, n x 4, normalised x1, y1, x2, y2) and `KEY.labels.npy` (int32, n:
codebook classes for masked object classification).

Optional: a work directory scored without `--regions` has no `regions/` table, its shards carry
no region arrays, and the trainer computes patch features on the fly. The table layout is stage
4's (`lait.schemas`, `lait.arrays`); arrays go into the tar with `np.save(allow_pickle=False)`.
"""

from __future__ import annotations

import io
import logging
from collections import defaultdict
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lait.workdir import WorkDir, partition_of

log = logging.getLogger(__name__)


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _rows(work: WorkDir, table: str, partition: int, urls: set[str]) -> dict[str, dict]:
    t = work.read(table, partition)
    if t.num_rows == 0:
        return {}
    t = t.filter(pc.is_in(t.column("image_url"), value_set=pa.array(sorted(urls), pa.string())))
    return {r["image_url"]: r for r in t.to_pylist()}


class RegionReader:
    """The region arrays of a set of images, as shard members (extension -> .npy bytes)."""

    def __init__(self, arrays: dict[str, dict[str, bytes]]):
        self._arrays = arrays

    @classmethod
    def load(cls, work: WorkDir, urls: Iterable[str]) -> RegionReader | None:
        """Read only the partitions and rows these images need; None without a `regions/` table."""
        if not work.part_files("regions"):
            return None
        from lait.arrays import region_arrays

        by_part: dict[int, set[str]] = defaultdict(set)
        for url in urls:
            by_part[partition_of(url, work.n_partitions)].add(url)
        arrays: dict[str, dict[str, bytes]] = {}
        for p, wanted in sorted(by_part.items()):
            labels = _rows(work, "region_labels", p, wanted) if work.part_files("region_labels", p) else {}
            for url, row in _rows(work, "regions", p, wanted).items():
                ra = region_arrays(row, labels.get(url))
                out = {"regions.npy": npy_bytes(ra.features.astype(np.float16)),
                       "boxes.npy": npy_bytes(ra.boxes.astype(np.float32))}
                if ra.labels is not None:
                    out["labels.npy"] = npy_bytes(ra.labels.astype(np.int32))
                arrays[url] = out
        return cls(arrays)

    def arrays(self, image_url: str) -> dict[str, bytes]:
        return self._arrays.get(image_url, {})
