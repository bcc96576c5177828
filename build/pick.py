"""Pass 1 of `lait build` (per partition): one row per image URL with all its scored texts.

`scored/` and `images_ok/` are both partitioned by image URL, so each partition joins locally.
The row keeps where the image bytes are (part file, row group, row) instead of the bytes, so
the global pass stays small and the shard pass reads each row group once.

The join is done by column: the partition's texts are read as one Arrow table, each image's
candidates are a slice of them taken in one `take`, and the rows are written as a table.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from lait import storage
from lait.parts import PartContext
from lait.schemas import get_table
from lait.stage import Stage

OK_COLUMNS = ["image_url", "sha256", "phash", "width", "height", "format"]
# Columns images_ok gained later: read when there, null otherwise.
LATER_COLUMNS = {"fetched_sha256": pa.string(), "punsafe": pa.float32(), "face_bboxes": pa.list_(pa.list_(pa.float32())), "rights": pa.string()}
CANDIDATE_TYPE = get_table("build_images").schema.field("candidates").type
SCORED_COLUMNS = ["image_url"] + [f.name for f in CANDIDATE_TYPE.value_type]


class PickStage(Stage):
    """Joins a partition of `scored/` with `images_ok/` into `build_images/`."""

    name = "build_pick"
    input_table = "scored"
    extra_inputs = ("images_ok",)
    output_tables = ("build_images",)

    def process(self, ctx: PartContext) -> None:
        scored = ctx.work.read("scored", ctx.partition, columns=SCORED_COLUMNS)
        ctx.count("build/scored_pairs", scored.num_rows)
        # Each URL's texts, in the order they were scored.
        by_url: dict[str, list[int] | None] = {}  # None once an images_ok row took the URL
        for i, url in enumerate(scored.column("image_url").to_pylist()):
            by_url.setdefault(url, []).append(i)

        # The first images_ok row of each URL that has texts, and where its bytes lie.
        images, files, groups, rows, cand_rows, offsets = [], [], [], [], [], [0]
        for path in ctx.work.part_files("images_ok", ctx.partition):
            pf = storage.parquet_file(path)
            table = pf.read(columns=OK_COLUMNS + [c for c in LATER_COLUMNS if c in pf.schema_arrow.names])
            for name, tp in LATER_COLUMNS.items():  # images_ok from before them: not scored, not searched
                if name not in table.column_names:
                    table = table.append_column(name, pa.nulls(table.num_rows, tp))
            sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
            group_of = np.repeat(np.arange(len(sizes)), sizes)
            start_of = np.repeat(np.cumsum([0] + sizes[:-1]), sizes)
            keep = []
            for i, url in enumerate(table.column("image_url").to_pylist()):
                cands = by_url.get(url)
                if cands is None:
                    continue  # no text survived stage 3/4 (rejected there), or a repeat row
                by_url[url] = None  # taken: a repeat row of the URL is skipped
                keep.append(i)
                cand_rows += cands
                offsets.append(len(cand_rows))
            if keep:
                idx = np.array(keep, np.int64)
                images.append(table.take(idx))
                files += [path.name] * len(keep)
                groups.append(group_of[idx])
                rows.append(idx - start_of[idx])
        if images:
            ok = pa.concat_tables(images)
            values = pa.StructArray.from_arrays(
                [scored.column(f.name).combine_chunks() for f in CANDIDATE_TYPE.value_type],
                fields=list(CANDIDATE_TYPE.value_type)).take(pa.array(cand_rows, pa.int64()))
            columns = {name: ok.column(name) for name in OK_COLUMNS + list(LATER_COLUMNS)}
            columns.update(src_file=pa.array(files, pa.string()),
                           row_group=pa.array(np.concatenate(groups), pa.int32()),
                           row_index=pa.array(np.concatenate(rows), pa.int32()),
                           candidates=pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values,
                                                               type=CANDIDATE_TYPE))
            ctx.write_table("build_images", pa.table(columns))

        texts = scored.select(["page_url", "text"])
        for url in sorted(u for u, cands in by_url.items() if cands is not None):
            first = by_url[url][0]
            ctx.reject("build/no_image", image_url=url, page_url=texts["page_url"][first].as_py(),
                       text=texts["text"][first].as_py(), detail="scored texts but no images_ok row")
        ctx.count("build/images", len(files))
