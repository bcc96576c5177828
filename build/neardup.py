"""Near-duplicate image pairs that stage 4 found from image embeddings (`near_dups/`, see
`lait.schemas`): stage 5 merges them into its duplicate groups. Optional: without the table,
groups come from sha256 and perceptual hashes alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from lait import storage
from lait.parts import WorkDir

log = logging.getLogger(__name__)


def embedding_pairs(work: WorkDir, index: Mapping[str, int]) -> list[tuple[int, int]]:
    """Index pairs (into `index`) of images stage 4 found to be near-duplicates (`near_dups/`)."""
    pairs: list[tuple[int, int]] = []
    for f in work.part_files("near_dups"):
        t = storage.read_table(f, columns=["image_url_a", "image_url_b"])
        for a, b in zip(t.column(0).to_pylist(), t.column(1).to_pylist()):
            if a in index and b in index and a != b:
                pairs.append((index[a], index[b]))
    if pairs:
        log.info("build: %d embedding near-duplicate pairs from near_dups/", len(pairs))
    return pairs
