"""A text that moves to another image of a duplicate group is scored against that image first.

Stage 4 scored every text against the image URL it was found beside. When stage 5 groups copies
of one picture, the group's sample is its representative, and a text found beside another copy
would otherwise reach the sample with a score computed on different pixels (or, if grouping was
wrong, on a different picture). So each such text gets the cosine of the representative's image
embedding and its own text embedding, the embeddings stage 4 stored (`image_embs/`,
`text_embs/`, read with `lait.arrays`): the same L2-normalised cosine the scorer computes, and
what `lait export-embeddings` exports for the sample. The rescored text then goes through the
same rules and thresholds as every other candidate.

When the embeddings cannot be found (a work directory without `image_embs/`), a text of a copy
with the representative's exact bytes (equal sha256) keeps its score, since it was scored on the
same input; any other text does not move: it stays with its own image, which the group drops.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lait.arrays import stack_embs
from lait.workdir import WorkDir, partition_of

log = logging.getLogger(__name__)


def cosine(image: np.ndarray, text: np.ndarray) -> float:
    """The scorer's score: the cosine of two L2-normalised embeddings. The stored fp16 vectors
    are renormalised in fp32, so their rounding does not shrink the cosine."""
    a, b = image.astype(np.float32), text.astype(np.float32)
    return float(np.dot(a, b) / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-12))


def read_image_embs(work: WorkDir, urls: Iterable[str]) -> dict[str, np.ndarray]:
    """The stored image embedding of each of `urls` that has one (each partition read once)."""
    by_part: dict[int, set[str]] = defaultdict(set)
    for u in urls:
        by_part[partition_of(u, work.n_partitions)].add(u)
    out: dict[str, np.ndarray] = {}
    for p, wanted in sorted(by_part.items()):
        if not work.part_files("image_embs", p):
            continue
        t = work.read("image_embs", p, columns=["image_url", "dim", "emb"])
        t = t.filter(pc.is_in(t["image_url"], value_set=pa.array(sorted(wanted), pa.string())))
        for url, emb in zip(t["image_url"].to_pylist(), stack_embs(t)):
            out.setdefault(url, emb)
    return out


def read_text_embs(work: WorkDir, wanted: dict[int, set[str]]) -> dict[tuple[int, str], np.ndarray]:
    """(partition, text) -> the stored text embedding, for the texts wanted from each partition
    (a text is encoded in the partition of the image URL it was scored with)."""
    out: dict[tuple[int, str], np.ndarray] = {}
    for p, texts in sorted(wanted.items()):
        if not work.part_files("text_embs", p):
            continue
        t = work.read("text_embs", p)
        t = t.filter(pc.is_in(t["text"], value_set=pa.array(sorted(texts), pa.string())))
        for text, emb in zip(t["text"].to_pylist(), stack_embs(t)):
            out.setdefault((p, text), emb)
    return out


def rescore_groups(work: WorkDir, groups: Sequence[Any]) -> dict[str, int]:
    """Set each group's `candidates` to its representative's own texts plus the texts of its
    other members rescored against the representative (`lait.build.aggregate.Group`). Returns
    counters: texts rescored, and texts left behind for want of embeddings."""
    moving = [(g, im) for g in groups for im in g.members if im is not g.rep]
    n = work.n_partitions
    wanted: dict[int, set[str]] = defaultdict(set)
    for _, im in moving:
        wanted[partition_of(im.url, n)].update(c.text for c in im.candidates)
    images = read_image_embs(work, {g.rep.url for g, _ in moving}) if moving else {}
    texts = read_text_embs(work, wanted) if moving else {}
    rescored: dict[int, list] = defaultdict(list)  # id(member) -> its rescored candidates
    left = n_rescored = 0
    for g, im in moving:
        rep_emb, p = images.get(g.rep.url), partition_of(im.url, n)
        same_bytes = im.sha256 == g.rep.sha256
        for c in im.candidates:
            text_emb = texts.get((p, c.text))
            if rep_emb is not None and text_emb is not None:
                rescored[id(im)].append(c._replace(score=cosine(rep_emb, text_emb)))
                n_rescored += 1
            elif same_bytes:
                rescored[id(im)].append(c)
            else:
                left += 1
    for g in groups:
        g.candidates = [c for im in g.members for c in (im.candidates if im is g.rep else rescored.get(id(im), []))]
    counters = {"build/texts_rescored": n_rescored}
    if left:
        counters["build/texts_not_moved"] = left
        log.warning("build: %d texts of duplicate copies stay behind: no stored embeddings to score them "
                    "against their group's image (image_embs/, text_embs/ of stage 4)", left)
    return counters
