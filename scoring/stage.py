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

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from lait.parts import PartContext
from lait.scoring.config import ScoreConfig, loader_workers
from lait.scoring.decode import (
    DeviceJpegDecoder,
    ImageDecoder,
    decode_stream,
    hybrid_stream,
    keeping_pools,
    release_pools,
    shared_pool,
)
from lait.scoring.model import get_scorer
from lait.scoring.model import preflight as load_model_first
from lait.scoring.neardup import near_dups_step
from lait.scoring.regions import RegionLabelStage, codebook_step, pool_tokens
from lait.stage import RunReport, Stage

log = logging.getLogger(__name__)

SCORE_SLICE = 65_536  # pairs scored and written per Arrow table


def _binary_rows(a: np.ndarray, dtype: str) -> pa.Array:
    """Each row of a 2-d array as one little-endian binary value (as `lait.arrays.to_bytes`),
    without a Python object per row."""
    flat = np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<"))
    n = flat.shape[0]
    row = flat[0].nbytes if n else 0
    offsets = np.arange(n + 1, dtype=np.int32) * row
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(flat.reshape(-1))])


def emb_table(keys: list[str], shas: list | None, embs: np.ndarray, key: str = "image_url") -> pa.Table:
    """`image_embs/` (or, with key="text", `text_embs/`) rows of fp16 embeddings."""
    cols = {key: keys, "dim": np.full(len(keys), embs.shape[1], np.int32), "emb": _binary_rows(embs, "f2")}
    if shas is not None:
        cols["sha256"] = shas
    return pa.table(cols)


def region_table(keys: list[str], feats: np.ndarray, boxes: np.ndarray) -> pa.Table:
    """`regions/` rows: each image's fp16 (n, dim) region features and the grid's fp32 boxes."""
    n, r, d = feats.shape
    box = np.ascontiguousarray(boxes, "<f4").tobytes()
    return pa.table({"image_url": keys, "n": np.full(n, r, np.int32), "dim": np.full(n, d, np.int32),
                     "features": _binary_rows(feats.reshape(n, r * d), "f2"), "boxes": pa.array([box] * n, pa.binary())})


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
    # Settings of the global steps after the partitions (`after_steps`): changing
    # them redoes those steps, not the scoring.
    GLOBAL_SETTINGS = frozenset({"near_dup_threshold", "near_dup_k", "codebook_k", "codebook_sample",
                                 "codebook_iters", "seed"})

    # Its workers run torch: local ones are spawned, never forked from this process (whose
    # torch thread pool is up once `preflight` loaded the model).
    spawn_workers = True

    def __init__(self, cfg: ScoreConfig):
        self.cfg = cfg

    def settings(self) -> dict[str, Any]:
        return {k: v for k, v in self.cfg.output_settings().items() if k not in self.GLOBAL_SETTINGS}

    def preflight(self, work) -> None:
        """The model's weights load before anything is written (`lait.scoring.model.preflight`)."""
        load_model_first(self.cfg)

    def running(self) -> contextlib.AbstractContextManager[None]:
        """One decode pool for every partition this process scores itself."""
        return keeping_pools()

    def after_steps(self, work, report: RunReport, run: Callable[..., RunReport]) -> list[RunReport]:
        """`near_dups/` over every image embedding; with `regions`, the codebook over all region
        features and `RegionLabelStage` (light: one worker)."""
        near_dups_step(work, self.cfg, report)
        if self.cfg.regions and codebook_step(work, self.cfg, report):
            labels = run(RegionLabelStage(), workers=1)
            report.failed.update(labels.failed)  # a partition left unlabelled fails `lait score`
            return [labels]
        return []

    def process(self, ctx: PartContext) -> None:
        cfg = self.cfg
        set_threads(cfg)
        scorer = get_scorer(cfg)
        pairs_by_image, text_ids = self._pairs(ctx)
        if not pairs_by_image:
            return
        text_embs = self._encode_texts(ctx, scorer, list(text_ids))
        try:
            refs, image_embs, failed = self._encode_images(ctx, scorer, pairs_by_image)
        finally:
            release_pools()
        self._write_scores(ctx, scorer, pairs_by_image, text_ids, text_embs, refs, image_embs, failed)

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
        if texts:
            ctx.write_table("text_embs", emb_table(texts, None, text_embs, key="text"))
        return text_embs

    def _encode_images(self, ctx: PartContext, scorer, pairs_by_image: dict
                       ) -> tuple[dict[str, int], np.ndarray, dict[str, str]]:
        """Images decoded beside the model (worker processes, and on CUDA the GPU's JPEG decoder
        too), each model batch queued before the previous one's result is waited for; writes
        `image_embs/` (and `regions/`) a batch at a time. Returns (URL -> ref, the embeddings in
        ref order, URL -> decode error)."""
        cfg = self.cfg
        refs: dict[str, int] = {}
        chunks: list[np.ndarray] = []
        failed: dict[str, str] = {}
        grid = scorer.patch_grid if cfg.regions else None
        sha: dict[str, str | None] = {}
        stream = self._decoded(ctx, scorer, pairs_by_image, sha)

        def finish(keys: list[str], pending) -> None:
            out = pending.result()
            embs, toks = (out if grid is not None else (out, None))
            if toks is not None:
                feats, boxes = pool_tokens(toks, grid, cfg.max_regions)
                ctx.write_table("regions", region_table(keys, feats, boxes))
            for url in keys:
                refs[url] = len(refs)
            chunks.append(embs)
            ctx.write_table("image_embs", emb_table(keys, [sha.get(u) for u in keys], embs))
            ctx.count("images", len(keys))

        queued = None
        for batch in stream:
            failed.update(batch.errors)
            if not batch.keys:
                continue
            pending = scorer.encode_images_async(batch.pixels, tokens=grid is not None)
            if queued is not None:
                finish(*queued)
            queued = (batch.keys, pending)
        if queued is not None:
            finish(*queued)
        dim = chunks[0].shape[1] if chunks else scorer.embed_dim
        return refs, (np.concatenate(chunks) if chunks else np.zeros((0, dim), np.float32)), failed

    def _decoded(self, ctx: PartContext, scorer, pairs_by_image: dict, sha: dict):
        """Batches of decoded images: on CUDA from the GPU's JPEG decoder and the CPU workers
        side by side (`hybrid_stream`), otherwise from the CPU workers (`decode_stream`)."""
        cfg = self.cfg
        decoder = ImageDecoder(scorer.preprocess_cfg, cfg.fast_decode)
        workers = loader_workers(cfg, scorer.device)
        pool = shared_pool(workers) if workers > 0 else None
        items = self._image_bytes(ctx, pairs_by_image, sha)
        device = getattr(scorer, "device", "cpu")
        if cfg.gpu_decode and cfg.fast_decode and decoder.geometry.fast and str(device).startswith("cuda"):
            try:
                device_decoder = DeviceJpegDecoder(decoder, device)
            except Exception as exc:  # no nvJPEG in this torchvision build: the CPU decodes all
                log.warning("score: JPEG decoding on %s is not available (%s); decoding on the CPU", device, exc)
            else:
                return hybrid_stream(device_decoder, decoder, items, cfg.batch_size, pool)
        return decode_stream(decoder, items, cfg.batch_size, workers, pool=pool)

    def _write_scores(self, ctx: PartContext, scorer, pairs_by_image: dict, text_ids: dict[str, int],
                      text_embs: np.ndarray, refs: dict[str, int], image_embs: np.ndarray,
                      failed: dict[str, str]) -> None:
        """One `scored/` row per pair, in candidate order; the pairs of an image that did not
        decode are rejected. Scores are computed and written by column, a slice of pairs at a time."""
        cols: dict[str, list] = {k: [] for k in ("image_url", "page_url", "text", "source", "lang", "license",
                                                 "image_license")}
        irefs: list[int] = []
        tids: list[int] = []
        for url, pairs in pairs_by_image.items():
            if url in failed:
                for page_url, t, _ in pairs:
                    ctx.reject("decode_error", image_url=url, page_url=page_url, text=t["text"], detail=failed[url])
                continue
            ref = refs.get(url)
            if ref is None:
                ctx.count("no_image", len(pairs))
                continue
            for page_url, t, (license_, image_license) in pairs:
                cols["image_url"].append(url)
                cols["page_url"].append(page_url)
                cols["text"].append(t["text"])
                cols["source"].append(t["source"])
                cols["lang"].append(t.get("lang"))
                cols["license"].append(license_)
                cols["image_license"].append(image_license)
                irefs.append(ref)
                tids.append(text_ids[t["text"]])
        n = len(irefs)
        ia, ta = np.asarray(irefs, np.int64), np.asarray(tids, np.int64)
        for start in range(0, n, SCORE_SLICE):
            sl = slice(start, min(n, start + SCORE_SLICE))
            scores = np.einsum("ij,ij->i", image_embs[ia[sl]], text_embs[ta[sl]], dtype=np.float32)
            table = {k: v[sl] for k, v in cols.items()}
            table.update(score=scores, image_emb_ref=ia[sl], text_emb_ref=ta[sl],
                         model=[scorer.name] * (sl.stop - sl.start), pretrained=[scorer.pretrained] * (sl.stop - sl.start))
            ctx.write_table("scored", pa.table(table))

    def _image_bytes(self, ctx: PartContext, wanted: dict, sha: dict) -> Iterator[tuple[str, bytes]]:
        """(image_url, bytes) of the partition's images that have candidates, each once."""
        seen = set()
        # Views into the row groups, read ahead without the GIL: no copy of the bytes on the way to
        # the GPU's decoder (what goes to the worker processes is copied when it is sent).
        for row in ctx.work.iter_rows("images_ok", ctx.partition, columns=["image_url", "bytes", "sha256"],
                                      batch_size=64, views=True, read_ahead=4):
            url = row["image_url"]
            if url in wanted and url not in seen:
                seen.add(url)
                sha[url] = row["sha256"]
                yield url, row["bytes"] or b""
