"""Tables stage 5 owns inside the work directory (registered with `lait.schemas`).

- `build_images/`: one row per image URL that has scored texts, joined with its `images_ok/`
  row (hashes, size, and where its bytes live), with every scored candidate. Partitioned like
  `scored/` (by image URL). Written by the per-partition pick pass.
- `build_plan/`: one row per final sample, partitioned by shard number: the global pass decides
  everything (caption, key, metadata) and the shard pass only copies bytes into tars.
"""

from __future__ import annotations

import pyarrow as pa

from lait.schemas import Table, register_table

CANDIDATE = pa.struct([
    pa.field("text", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("lang", pa.string()),
    pa.field("score", pa.float32(), nullable=False),
    pa.field("page_url", pa.string(), nullable=False),
    pa.field("model", pa.string()),
    pa.field("pretrained", pa.string()),
])

BUILD_IMAGES = register_table(Table("build_images", pa.schema([
    pa.field("image_url", pa.string(), nullable=False),
    pa.field("sha256", pa.string(), nullable=False),
    pa.field("phash", pa.string(), nullable=False),
    pa.field("width", pa.int32(), nullable=False),
    pa.field("height", pa.int32(), nullable=False),
    pa.field("format", pa.string(), nullable=False),
    # Where the bytes are: images_ok part file name, row group, row inside the group.
    pa.field("src_file", pa.string(), nullable=False),
    pa.field("row_group", pa.int32(), nullable=False),
    pa.field("row_index", pa.int32(), nullable=False),
    pa.field("candidates", pa.list_(CANDIDATE), nullable=False),
]), "image_url"))

BUILD_PLAN = register_table(Table("build_plan", pa.schema([
    pa.field("key", pa.string(), nullable=False),
    pa.field("shard", pa.int32(), nullable=False),
    pa.field("image_url", pa.string(), nullable=False),
    pa.field("page_url", pa.string(), nullable=False),
    pa.field("caption", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("lang", pa.string()),
    pa.field("score", pa.float32(), nullable=False),
    pa.field("width", pa.int32(), nullable=False),
    pa.field("height", pa.int32(), nullable=False),
    pa.field("format", pa.string(), nullable=False),
    pa.field("sha256", pa.string(), nullable=False),
    pa.field("phash", pa.string(), nullable=False),
    pa.field("src_file", pa.string(), nullable=False),
    pa.field("row_group", pa.int32(), nullable=False),
    pa.field("row_index", pa.int32(), nullable=False),
    pa.field("n_candidates", pa.int32(), nullable=False),
    pa.field("n_duplicates", pa.int32(), nullable=False),
    # KEY.json, decided by the global pass (a JSON object as text).
    pa.field("meta", pa.string(), nullable=False),
]), "key"))

BUILD_TABLES = ("build_images", "build_plan")
