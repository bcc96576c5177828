"""Stage 4's document pass (`lait documents`, issue 63): doc_pages/ -> doc_sims/ (by page URL).

For each document of stage 3's document pass, the cosine of each of its pictures and each of its
sentences in stage 4's scorer: the matrix MMC4 keeps as `similarity_matrix` and from which
stage 5 places every picture among the sentences. A picture's embedding is the one stage 4
stored in `image_embs/` when it scored the picture for its captions; only the pictures it never
scored (no candidate text) are encoded here, from the bytes stage 2 kept, and only the
sentences are new text. The cosine is stage 4's: the dot product of the two L2-normalised
embeddings. A picture with no `images_ok/` row (never fetched, or dropped by stage 2: too
small, unsafe, opted out) has no row of the matrix and a null URL in `image_urls`.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lait.arrays import stack_embs
from lait.parts import PartContext
from lait.scoring.config import ScoreConfig
from lait.scoring.decode import ImageDecoder, decode_stream
from lait.scoring.model import get_scorer
from lait.scoring.stage import set_threads
from lait.stage import Stage
from lait.workdir import partition_of

log = logging.getLogger(__name__)


class DocSimStage(Stage):
    """The similarity matrices of one partition of doc_pages/ (see the module's docstring)."""

    name = "score_documents"
    input_table = "doc_pages"
    output_tables = ("doc_sims",)
    version = 1
    SETTINGS = ("model", "pretrained", "checkpoint", "demo_dir", "precision", "fast_decode")
    # The scorer runs torch: local workers are spawned, never forked from a process whose torch
    # thread pool may be up (`lait demo`, `lait run` after scoring), where they can hang.
    spawn_workers = True

    def __init__(self, cfg: ScoreConfig):
        self.cfg = cfg

    def settings(self) -> dict[str, Any]:
        out = self.cfg.output_settings()
        return {k: out[k] for k in self.SETTINGS if k in out}

    def global_inputs(self, work) -> dict[str, Any]:
        """The stored image embeddings and the kept images every partition reads."""
        return {"image_embs": _parts_digest(work, "image_embs"), "images_ok": _parts_digest(work, "images_ok")}

    def process(self, ctx: PartContext) -> None:
        set_threads(self.cfg)
        docs = ctx.work.read("doc_pages", ctx.partition, columns=["page_url", "paragraphs", "images"]).to_pylist()
        if not docs:
            return
        scorer = get_scorer(self.cfg)
        wanted = {u for d in docs for im in d["images"] for u in im["urls"]}
        kept = _kept_urls(ctx.work, wanted)  # url -> sha256 of the images stage 2 kept
        chosen = [[next((u for u in im["urls"] if u in kept), None) for im in d["images"]] for d in docs]
        embs = self._image_embs(ctx, scorer, {u for c in chosen for u in c if u is not None}, kept)
        # Only the sentences of documents with a picture to place: the others leave at stage 5
        # (documents/no_image) whatever their sentences score.
        sentences = sorted({s for d, c in zip(docs, chosen) if any(u in embs for u in c if u)
                            for p in d["paragraphs"] for s in p})
        index = {s: i for i, s in enumerate(sentences)}
        text_embs = scorer.encode_texts(sentences, self.cfg.text_batch_size) if sentences else None
        ctx.count("documents/sentences_encoded", len(sentences))
        rows: dict[str, list] = defaultdict(list)
        for d, urls in zip(docs, chosen):
            urls = [u if u in embs else None for u in urls]
            scored = [embs[u] for u in urls if u is not None]
            ids = [index[s] for p in d["paragraphs"] for s in p] if scored else []
            if scored and ids:
                sims = np.stack(scored).astype(np.float32) @ text_embs[ids].astype(np.float32).T
            else:
                sims = np.zeros((len(scored), len(ids)), np.float32)
            rows["page_url"].append(d["page_url"])
            rows["image_urls"].append(urls)
            rows["n_sentences"].append(len(ids))
            rows["sims"].append(np.ascontiguousarray(sims, np.float32).tobytes())
            rows["model"].append(scorer.name)
            rows["pretrained"].append(scorer.pretrained)
        ctx.write_table("doc_sims", pa.table(rows))

    def _image_embs(self, ctx: PartContext, scorer, urls: set[str], kept: dict[str, str]) -> dict[str, np.ndarray]:
        """URL -> embedding (float32) of each wanted picture: stage 4's stored one when its
        bytes are the ones stored now, else encoded here from images_ok/."""
        out: dict[str, np.ndarray] = {}
        work = ctx.work
        for part, group in _by_partition(work, urls).items():
            if part not in work.partitions("image_embs"):
                continue
            t = work.read("image_embs", part)
            mask = pc.is_in(t.column("image_url"), pa.array(sorted(group)))
            t = t.filter(mask)
            if t.num_rows:
                vecs = stack_embs(t)
                for url, sha, v in zip(t.column("image_url").to_pylist(), t.column("sha256").to_pylist(), vecs):
                    if sha is None or sha == kept.get(url):
                        out[url] = v.astype(np.float32)
        missing = urls - out.keys()
        ctx.count("documents/images_reused", len(out))
        if missing:
            decoder = ImageDecoder(scorer.preprocess_cfg, self.cfg.fast_decode)
            for batch in decode_stream(decoder, _image_bytes(work, missing), self.cfg.batch_size, 0):
                if batch.keys:
                    for url, v in zip(batch.keys, scorer.encode_images(batch.pixels)):
                        out[url] = np.asarray(v, np.float32)
                ctx.count("documents/images_encoded", len(batch.keys))
                ctx.count("documents/images_undecodable", len(batch.errors))
        return out


def _by_partition(work, urls) -> dict[int, set[str]]:
    groups: dict[int, set[str]] = defaultdict(set)
    for u in urls:
        groups[partition_of(u, work.n_partitions)].add(u)
    return groups


def _kept_urls(work, urls: set[str]) -> dict[str, str]:
    """URL -> sha256 of those of `urls` that have an images_ok/ row."""
    out: dict[str, str] = {}
    have = set(work.partitions("images_ok"))
    for part, group in _by_partition(work, urls).items():
        if part in have:
            t = work.read("images_ok", part, columns=["image_url", "sha256"])
            for url, sha in zip(t.column("image_url").to_pylist(), t.column("sha256").to_pylist()):
                if url in group:
                    out[url] = sha
    return out


def _image_bytes(work, urls: set[str]):
    for part, group in _by_partition(work, urls).items():
        for row in work.iter_rows("images_ok", part, columns=["image_url", "bytes"], batch_size=64):
            if row["image_url"] in group:
                group.discard(row["image_url"])
                yield row["image_url"], row["bytes"] or b""


def _parts_digest(work, table: str) -> str:
    """A digest of the names and sizes of a table's parts: a new part of it (a rescore, a new
    filter run) redoes the documents' matrices."""
    import hashlib

    h = hashlib.sha256()
    for name, size in sorted(work.part_sizes(table)):
        h.update(f"{name} {size}\n".encode())
    return h.hexdigest()[:16]
