"""Pass 1 of `lait build` (per partition): one row per image URL with all its scored texts.

`scored/` and `images_ok/` are both partitioned by image URL, so each partition joins locally.
The row keeps where the image bytes are (part file, row group, row) instead of the bytes, so
the global pass stays small and the shard pass reads each row group once.
"""

from __future__ import annotations

from collections import defaultdict

from lait import storage
from lait.stage import PartContext, Stage

OK_COLUMNS = ["image_url", "sha256", "phash", "width", "height", "format"]
SCORED_COLUMNS = ["image_url", "page_url", "text", "source", "lang", "score", "model", "pretrained",
                  "license"]


class PickStage(Stage):
    """Joins a partition of `scored/` with `images_ok/` into `build_images/`."""

    name = "build_pick"
    input_table = "scored"
    extra_inputs = ("images_ok",)
    output_tables = ("build_images",)

    def process(self, ctx: PartContext) -> None:
        by_url: dict[str, list[dict]] = defaultdict(list)
        for row in ctx.work.iter_rows("scored", ctx.partition, columns=SCORED_COLUMNS, batch_size=4096):
            by_url[row.pop("image_url")].append(row)
        ctx.count("build/scored_pairs", sum(len(v) for v in by_url.values()))
        seen: set[str] = set()
        for path in ctx.work.part_files("images_ok", ctx.partition):
            pf = storage.parquet_file(path)
            for rg in range(pf.metadata.num_row_groups):
                group = pf.read_row_group(rg, columns=OK_COLUMNS).to_pylist()
                for idx, img in enumerate(group):
                    url = img["image_url"]
                    cands = by_url.get(url)
                    if not cands or url in seen:
                        continue  # no text survived stage 3/4 (rejected there), or a repeat row
                    seen.add(url)
                    ctx.write("build_images", {**img, "src_file": path.name, "row_group": rg,
                                               "row_index": idx, "candidates": cands})
        for url in sorted(by_url.keys() - seen):
            c = by_url[url][0]
            ctx.reject("build/no_image", image_url=url, page_url=c["page_url"], text=c["text"],
                       detail="scored texts but no images_ok row")
        ctx.count("build/images", len(seen))
