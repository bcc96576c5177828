"""Near-duplicate image pairs that stage 4 found from image embeddings (`near_dups/`, see
`lait.schemas`): stage 5 merges them into its duplicate groups when the pixels agree too.

An embedding alone is not enough: a weak or small scorer crowds its embeddings, and two
distinct photos (a street with buses, an unbaked pizza) reach any cosine threshold. Merging them
would drop one photo as a duplicate and give its caption to the other. So a pair is merged only
when a second, independent signal agrees: the 64-bit perceptual hashes of the two images
(stage 2's phash, kept in `images_ok/`) differ in at most `near_dup_max_phash` bits. Resizes and
re-encodes of one photo stay within 4 bits and crops of a few per cent within about 12; distinct
COCO photos are 20 bits apart or more (31 on average). A pair that passes both is still only a
proposal: the pixel check (`lait.build.pixels`) confirms it or not. Optional: without the table,
groups come from sha256 and perceptual hashes alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from lait import storage
from lait.build.dedup import hamming
from lait.workdir import WorkDir

log = logging.getLogger(__name__)


def embedding_pairs(work: WorkDir, index: Mapping[str, int], phashes: Sequence[int],
                    max_phash: int) -> list[tuple[int, int]]:
    """Index pairs (into `index`) of images stage 4 found to be near-duplicates (`near_dups/`)
    whose perceptual hashes (`phashes`, by index) also differ in at most `max_phash` bits."""
    pairs: list[tuple[int, int]] = []
    refused = 0
    for f in work.part_files("near_dups"):
        t = storage.read_table(f, columns=["image_url_a", "image_url_b"])
        for a, b in zip(t.column(0).to_pylist(), t.column(1).to_pylist()):
            if a in index and b in index and a != b:
                i, j = index[a], index[b]
                if hamming(phashes[i], phashes[j]) > max_phash:
                    refused += 1
                    continue
                pairs.append((i, j))
    if pairs or refused:
        log.info("build: %d embedding near-duplicate pairs from near_dups/ proposed, %d refused as their "
                 "perceptual hashes are more than %d bits apart", len(pairs), refused, max_phash)
    return pairs
