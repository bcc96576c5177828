"""`lait export-embeddings`: the shards' embeddings in clip-retrieval's layout.

    OUT/img_emb/img_emb_NNNNN.npy      fp16 (n x dim), L2-normalised image embeddings
    OUT/text_emb/text_emb_NNNNN.npy    fp16 (n x dim), L2-normalised caption embeddings
    OUT/metadata/metadata_NNNNN.parquet  one row per embedding row: image_path, caption, url, ...

File NNNNN holds the successful samples of tar NNNNN.tar in key order, so row i of each of the
three files is the same sample, and the files sort in the same order: what autofaiss
(`clip-retrieval index`) and `clip-retrieval back` read. The embeddings are the ones stage 4
stored (`image_embs/`, `text_embs/`, read with `lait.arrays`): nothing is encoded again.

The export holds the lock of OUT (`OUT/_lock`), and the work directory's too when OUT lies
inside it; the work directory it only reads is not locked.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lait import storage
from lait.arrays import stack_embs
from lait.build.sample import SUCCESS
from lait.build.shards import shard_files
from lait.config import Config, ConfigError, setting
from lait.drivers import open_work_dir
from lait.lock import locked_output
from lait.workdir import WorkDir, partition_of

log = logging.getLogger(__name__)

# Scalar fields of the sidecar that go into the metadata, after clip-retrieval's own two.
META_COLUMNS = ["key", "uid", "url", "score", "page_url", "source", "lang", "width", "height",
                "original_width", "original_height", "sha256", "fetched_sha256"]


@dataclass
class ExportConfig(Config):
    """Settings of `lait export-embeddings`."""

    work: str = setting("", "the work directory whose stage 4 stored the embeddings", positional=True)
    out: str = setting("", "folder for img_emb/, text_emb/ and metadata/")
    shards: str = setting("", "the shards to export (default: WORK/shards; or a folder `lait select` wrote)")

    def validate(self) -> None:
        if not self.work:
            raise ConfigError("a work directory is required")
        if not self.out:
            raise ConfigError("--out is required")
        if storage.is_remote_url(self.out):
            raise ConfigError("--out must be a local folder (the arrays are filled in place)")


@dataclass
class Sample:
    tar: int
    row: int
    urls: list[str]
    caption: str


def read_samples(shards: storage.Location) -> tuple[list[str], list[pa.Table], list[Sample]]:
    """Tar names, the metadata table of each, and every successful sample with its place."""
    names, tables, samples = [], [], []
    for ti, tar in enumerate(shard_files(shards)):
        side = storage.read_table(tar.with_suffix(".parquet"))
        side = side.filter(pc.equal(side["status"], SUCCESS)).sort_by("key")
        meta = pa.table({"image_path": side["key"], "caption": side["caption"],
                         **{c: side[c] for c in META_COLUMNS}, "tar": pa.array([tar.name] * side.num_rows)})
        names.append(tar.stem)
        tables.append(meta)
        for ri, (urls, caption) in enumerate(zip(side["urls"].to_pylist(), side["caption"].to_pylist())):
            samples.append(Sample(ti, ri, urls, caption))
    return names, tables, samples


class EmbeddingArrays:
    """The output arrays, one per tar, created once the dimension is known."""

    def __init__(self, folder: storage.Location, prefix: str, names: list[str], rows: list[int]):
        self.folder, self.prefix, self.names, self.rows = folder, prefix, names, rows
        self.arrays: list[np.ndarray] | None = None
        self.filled = [np.zeros(n, bool) for n in rows]

    def put(self, tar: int, row: int, emb: np.ndarray) -> None:
        if self.arrays is None:
            storage.make_dirs(self.folder)
            self.arrays = [np.lib.format.open_memmap(self.folder / f"{self.prefix}_{name}.npy", mode="w+",
                                                     dtype=np.float16, shape=(n, emb.shape[0]))
                           for name, n in zip(self.names, self.rows)]
        self.arrays[tar][row] = emb
        self.filled[tar][row] = True

    def missing(self) -> int:
        return sum(int((~f).sum()) for f in self.filled)

    def close(self) -> None:
        for a in self.arrays or []:
            a.flush()


def fill_images(work: WorkDir, samples: list[Sample], arrays: EmbeddingArrays) -> None:
    """Each sample's image embedding: the `image_embs/` row of its URL, in that URL's partition."""
    by_part: dict[int, dict[str, list[Sample]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        by_part[partition_of(s.urls[0], work.n_partitions)][s.urls[0]].append(s)
    for p, wanted in sorted(by_part.items()):
        t = work.read("image_embs", p, columns=["image_url", "dim", "emb"])
        t = t.filter(pc.is_in(t["image_url"], value_set=pa.array(sorted(wanted), pa.string())))
        for url, emb in zip(t["image_url"].to_pylist(), stack_embs(t)):
            for s in wanted.pop(url, []):
                arrays.put(s.tar, s.row, emb)


def fill_texts(work: WorkDir, samples: list[Sample], arrays: EmbeddingArrays) -> None:
    """Each caption's embedding from `text_embs/`. A partition holds the texts of its image URLs;
    the caption may have been found beside any copy of the picture, so the partitions of the
    sample's URLs are looked in first, then every other one for what is still missing."""
    todo: dict[str, list[Sample]] = defaultdict(list)
    first: dict[int, set[str]] = defaultdict(set)
    for s in samples:
        todo[s.caption].append(s)
        for u in s.urls:
            first[partition_of(u, work.n_partitions)].add(s.caption)
    for phase in ("urls", "all"):
        for p in work.partitions("text_embs"):
            texts = first.get(p, set()) if phase == "urls" else set(todo)
            texts &= todo.keys()
            if not texts:
                continue
            t = work.read("text_embs", p)
            t = t.filter(pc.is_in(t["text"], value_set=pa.array(sorted(texts), pa.string())))
            for text, emb in zip(t["text"].to_pylist(), stack_embs(t)):
                for s in todo.pop(text, []):
                    arrays.put(s.tar, s.row, emb)


def export_embeddings(cfg: ExportConfig) -> dict[str, Any]:
    """Write the embeddings of the shards' samples in clip-retrieval's layout; returns counts."""
    work = open_work_dir(cfg.work, initialized=True)
    shards = storage.location(cfg.shards) if cfg.shards else work.root / "shards"
    names, tables, samples = read_samples(shards)
    if not names:
        raise ConfigError(f"no shards in {shards}: run `lait build` (or `lait select`) first")
    if not work.part_files("image_embs"):
        raise ConfigError(f"{work.root} has no image_embs/: the embeddings come from `lait score`")
    out = storage.location(cfg.out)
    storage.make_dirs(out)
    with locked_output(out, "lait export-embeddings", reads=work):
        return write_export(work, out, names, tables, samples)


def write_export(work: WorkDir, out: storage.Location, names: list[str], tables: list[pa.Table],
                 samples: list[Sample]) -> dict[str, Any]:
    """The three folders of the export, OUT locked."""
    for folder, pattern in (("img_emb", r"img_emb_\d+\.npy"), ("text_emb", r"text_emb_\d+\.npy"),
                            ("metadata", r"metadata_\d+\.parquet")):
        for p in storage.list_dir(out / folder):  # an earlier export of more tars: rows must line up
            if re.fullmatch(pattern, p.name):
                storage.remove(p)
    rows = [t.num_rows for t in tables]
    images = EmbeddingArrays(out / "img_emb", "img_emb", names, rows)
    texts = EmbeddingArrays(out / "text_emb", "text_emb", names, rows)
    fill_images(work, samples, images)
    fill_texts(work, samples, texts)
    images.close()
    texts.close()
    if images.missing() or texts.missing():
        raise RuntimeError(f"export: {images.missing()} image and {texts.missing()} caption embeddings not found "
                           f"in {work.root}; were the shards built from this work directory?")
    storage.make_dirs(out / "metadata")
    for name, table in zip(names, tables):
        pq.write_table(table, out / "metadata" / f"metadata_{name}.parquet", compression="zstd")
    return {"samples": len(samples), "files": len(names), "out": str(out)}
