"""`ScoreStage`: joins `candidates/` with `images_ok/` in one partition and scores every pair.

Per partition: the distinct candidate texts are encoded once (alt texts repeat a lot), the
images are decoded in worker processes while the model encodes earlier batches, and each
(image, text) pair gets the cosine of the two L2-normalised embeddings as its `score`. The
embeddings are stored in fp16 (`image_embs/`, `text_embs/`), and with `regions` the patch
tokens pooled to region features (`regions/`); see `lait.arrays`.

Drops: a candidate whose image bytes do not decode is rejected per pair as `score/decode_error`.
A candidate whose image is not in `images_ok/` was dropped by stage 2, which recorded why; it is
only counted here (`score/no_image`), so the funnel does not count it twice.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from lait.arrays import to_bytes
from lait.scoring.config import ScoreConfig
from lait.scoring.decode import ImageDecoder, decode_stream
from lait.scoring.model import get_scorer
from lait.scoring.regions import pool_tokens
from lait.stage import PartContext, Stage

log = logging.getLogger(__name__)


def set_threads(cfg: ScoreConfig) -> None:
    """One thread count per scoring process whatever started it: a Ray worker starts with one
    (OMP_NUM_THREADS=1), a local one with all cores, and matrix products summed in another
    order differ in their last bits, which would make scores depend on the executor."""
    import torch

    n = cfg.threads or max(1, (os.cpu_count() or 1) // max(1, cfg.workers))
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


class ScoreStage(Stage):
    """Stage 4 over one partition: scores, embeddings and (optionally) region features."""

    name = "score"
    input_table = "candidates"
    extra_inputs = ("images_ok",)
    output_tables = ("scored", "image_embs", "text_embs", "regions")
    # Settings of the global steps after the partitions (see lait.scoring.pipeline): changing
    # them redoes those steps, not the scoring.
    GLOBAL_SETTINGS = frozenset({"near_dup_threshold", "near_dup_k", "codebook_k", "codebook_sample",
                                 "codebook_iters", "seed"})

    def __init__(self, cfg: ScoreConfig):
        self.cfg = cfg

    def settings(self) -> dict[str, Any]:
        return {k: v for k, v in self.cfg.output_settings().items() if k not in self.GLOBAL_SETTINGS}

    def process(self, ctx: PartContext) -> None:
        cfg = self.cfg
        set_threads(cfg)
        scorer = get_scorer(cfg)
        pairs_by_image, text_ids = self._pairs(ctx)
        if not pairs_by_image:
            return
        text_embs = self._encode_texts(ctx, scorer, list(text_ids))
        image_embs, failed = self._encode_images(ctx, scorer, pairs_by_image)
        self._write_scores(ctx, scorer, pairs_by_image, text_ids, text_embs, image_embs, failed)

    def _pairs(self, ctx: PartContext) -> tuple[dict[str, list[tuple[str, dict, str | None]]], dict[str, int]]:
        """(image URL -> [(page URL, text entry, (page licence, image licence))], text -> id) of the
        partition's candidates.

        Candidates are small (texts only): the partition is held, image bytes are streamed."""
        pairs_by_image: dict[str, list[tuple[str, dict, str | None]]] = {}
        text_ids: dict[str, int] = {}
        for row in ctx.work.iter_rows("candidates", ctx.partition):
            for t in row["texts"]:
                text = t["text"]
                if not text:
                    continue
                text_ids.setdefault(text, len(text_ids))
                pairs_by_image.setdefault(row["image_url"], []).append(
                    (row["page_url"], t, (row.get("license"), row.get("image_license"))))
        ctx.count("pairs", sum(map(len, pairs_by_image.values())))
        ctx.count("distinct_texts", len(text_ids))
        return pairs_by_image, text_ids

    def _encode_texts(self, ctx: PartContext, scorer, texts: list[str]) -> np.ndarray:
        """Each distinct text encoded once, written to `text_embs/`."""
        text_embs = scorer.encode_texts(texts, self.cfg.text_batch_size)
        for text, emb in zip(texts, text_embs):
            ctx.write("text_embs", {"text": text, "dim": emb.shape[0], "emb": to_bytes(emb, "f2")})
        return text_embs

    def _encode_images(self, ctx: PartContext, scorer, pairs_by_image: dict
                       ) -> tuple[dict[str, tuple[int, np.ndarray]], dict[str, str]]:
        """Images decoded in worker processes while the model encodes earlier batches; writes
        `image_embs/` (and `regions/`). Returns (URL -> (ref, embedding), URL -> decode error)."""
        cfg = self.cfg
        image_embs: dict[str, tuple[int, np.ndarray]] = {}
        failed: dict[str, str] = {}
        decoder = ImageDecoder(scorer.preprocess_cfg, cfg.fast_decode)
        grid = scorer.patch_grid if cfg.regions else None
        sha = {}
        for batch in decode_stream(decoder, self._image_bytes(ctx, pairs_by_image, sha), cfg.batch_size,
                                   cfg.loader_workers):
            failed.update(batch.errors)
            if not batch.keys:
                continue
            if grid is not None:
                embs, toks = scorer.encode_images(batch.pixels, tokens=True)
                feats, boxes = pool_tokens(toks, grid, cfg.max_regions)
                box_bytes = to_bytes(boxes, "f4")
                for url, f in zip(batch.keys, feats):
                    ctx.write("regions", {"image_url": url, "n": f.shape[0], "dim": f.shape[1],
                                          "features": to_bytes(f, "f2"), "boxes": box_bytes})
            else:
                embs = scorer.encode_images(batch.pixels)
            for url, emb in zip(batch.keys, embs):
                image_embs[url] = (len(image_embs), emb)
                ctx.write("image_embs", {"image_url": url, "sha256": sha.get(url), "dim": emb.shape[0],
                                         "emb": to_bytes(emb, "f2")})
            ctx.count("images", len(batch.keys))
        return image_embs, failed

    def _write_scores(self, ctx: PartContext, scorer, pairs_by_image: dict, text_ids: dict[str, int],
                      text_embs: np.ndarray, image_embs: dict, failed: dict[str, str]) -> None:
        """One `scored/` row per pair; the pairs of an image that did not decode are rejected."""
        for url, pairs in pairs_by_image.items():
            if url in failed:
                for page_url, t, _ in pairs:
                    ctx.reject("decode_error", image_url=url, page_url=page_url, text=t["text"], detail=failed[url])
                continue
            if url not in image_embs:
                ctx.count("no_image", len(pairs))
                continue
            ref, emb = image_embs[url]
            for page_url, t, (license_, image_license) in pairs:
                tid = text_ids[t["text"]]
                ctx.write("scored", {
                    "image_url": url, "page_url": page_url, "text": t["text"], "source": t["source"],
                    "lang": t.get("lang"), "score": float(np.dot(emb, text_embs[tid])),
                    "model": scorer.name, "pretrained": scorer.pretrained,
                    "image_emb_ref": ref, "text_emb_ref": tid, "license": license_,
                    "image_license": image_license})

    def _image_bytes(self, ctx: PartContext, wanted: dict, sha: dict) -> Iterator[tuple[str, bytes]]:
        """(image_url, bytes) of the partition's images that have candidates, each once."""
        seen = set()
        for row in ctx.work.iter_rows("images_ok", ctx.partition, columns=["image_url", "bytes", "sha256"],
                                      batch_size=64):
            url = row["image_url"]
            if url in wanted and url not in seen:
                seen.add(url)
                sha[url] = row["sha256"]
                yield url, row["bytes"] or b""
