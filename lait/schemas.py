"""Arrow schemas of the tables that pass between stages (DESIGN.md, "Data between stages").

Each table is a folder of Parquet parts inside a work directory. The schema is the contract:
a writer validates every row against it, so a stage cannot silently drift a column.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

TIMESTAMP = pa.timestamp("us", tz="UTC")

PAGES = pa.schema(
    [
        pa.field("url", pa.string(), nullable=False),
        pa.field("status", pa.int32(), nullable=False),
        pa.field("fetched_at", TIMESTAMP, nullable=False),
        pa.field("headers", pa.map_(pa.string(), pa.string())),
        pa.field("content_type", pa.string()),
        # Raw page bytes as served; Parquet compresses the column (zstd).
        pa.field("html", pa.binary()),
        pa.field("encoding", pa.string()),
        pa.field("depth", pa.int32()),
        pa.field("referer", pa.string()),
        pa.field("error", pa.string()),
    ]
)

IMAGES = pa.schema(
    [
        pa.field("image_url", pa.string(), nullable=False),
        pa.field("page_url", pa.string()),
        pa.field("bytes", pa.binary()),
        pa.field("mime", pa.string()),
        pa.field("status", pa.int32(), nullable=False),
        pa.field("fetched_at", TIMESTAMP, nullable=False),
        pa.field("error", pa.string()),
    ]
)

IMAGES_OK = pa.schema(
    list(IMAGES)
    + [
        pa.field("width", pa.int32(), nullable=False),
        pa.field("height", pa.int32(), nullable=False),
        pa.field("format", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        # 64-bit perceptual hash as 16 hex digits (imagehash.phash).
        pa.field("phash", pa.string(), nullable=False),
    ]
)

TEXT = pa.struct(
    [
        pa.field("text", pa.string(), nullable=False),
        # alt, title, figcaption, aria, og, context
        pa.field("source", pa.string(), nullable=False),
        pa.field("lang", pa.string()),
    ]
)

CANDIDATES = pa.schema(
    [
        pa.field("page_url", pa.string(), nullable=False),
        pa.field("image_url", pa.string(), nullable=False),
        pa.field("texts", pa.list_(TEXT), nullable=False),
    ]
)

SCORED = pa.schema(
    [
        pa.field("image_url", pa.string(), nullable=False),
        pa.field("page_url", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("lang", pa.string()),
        pa.field("score", pa.float32(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("pretrained", pa.string()),
        # Row index of this pair's embeddings in the partition's embedding arrays.
        pa.field("image_emb_ref", pa.int64()),
        pa.field("text_emb_ref", pa.int64()),
    ]
)

REJECTED = pa.schema(
    [
        # "stage/rule", e.g. "filter/min_side"
        pa.field("reason", pa.string(), nullable=False),
        pa.field("image_url", pa.string()),
        pa.field("page_url", pa.string()),
        pa.field("text", pa.string()),
        pa.field("detail", pa.string()),
    ]
)


@dataclass(frozen=True)
class Table:
    """A table of the work directory: its folder name, schema and partitioning key."""

    name: str
    schema: pa.Schema
    key: str


TABLES: dict[str, Table] = {
    t.name: t
    for t in [
        Table("pages", PAGES, "url"),
        Table("images", IMAGES, "image_url"),
        Table("images_ok", IMAGES_OK, "image_url"),
        Table("candidates", CANDIDATES, "image_url"),
        Table("scored", SCORED, "image_url"),
        Table("rejected", REJECTED, "reason"),
    ]
}


def register_table(table: Table) -> Table:
    """Add a table that a stage owns (for example embeddings or region features)."""
    existing = TABLES.get(table.name)
    if existing is not None and not existing.schema.equals(table.schema):
        raise ValueError(f"table {table.name!r} is already registered with another schema")
    TABLES[table.name] = table
    return table


# Tables a stage owns and registers in its own module; imported on first use, so a reader of
# `near_dups/` (stage 5, `lait stats`) need not know which module defines it.
TABLE_MODULES = {
    "warc_links": "lait.crawler.warc_links",
    "image_embs": "lait.scoring.tables",
    "text_embs": "lait.scoring.tables",
    "regions": "lait.scoring.tables",
    "region_labels": "lait.scoring.tables",
    "near_dups": "lait.scoring.tables",
    "build_images": "lait.build.tables",
    "build_plan": "lait.build.tables",
}


def get_table(name: str) -> Table:
    if name not in TABLES and name in TABLE_MODULES:
        import importlib

        importlib.import_module(TABLE_MODULES[name])
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"unknown table {name!r}; known: {sorted(set(TABLES) | set(TABLE_MODULES))}") from None
