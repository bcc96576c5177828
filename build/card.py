"""`README.md` of a shard folder: a Hugging Face dataset card whose YAML header types every field.

Hugging Face `datasets` types a WebDataset folder from its first five samples unless the folder's
card says the features. Most keys of `KEY.json` are never null nor empty for that reason
(`build.sample`), but `face_bboxes` is `[]` for a picture without faces: five such samples in a
row typed it as a list of nulls, and the first sample with a face then failed the whole load.
The card gives the features from the schema the shards were written with (`build.sample.FIELDS`
and a URL list's extra columns, as the sidecars hold them), so `load_dataset(FOLDER)` and a Hub
repository of the folder load whatever order the samples come in. Its `configs` entry names the
tars as the data, so the sidecars beside them are not read as a second dataset.

The features use the `list:` form of `datasets` 4 and later.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import yaml

from lait.build.sample import FIELDS, REASON

CARD_FILE = "README.md"
# The `.npy` members stage 4's region features add (`build.regions`), and their element types.
REGION_MEMBERS = {"regions.npy": "float16", "boxes.npy": "float32", "labels.npy": "int32"}


def feature(tp: pa.DataType) -> dict[str, Any]:
    """The YAML form `datasets` gives an Arrow type (without the `name`)."""
    if pa.types.is_struct(tp):
        return {"struct": [{"name": f.name, **feature(f.type)} for f in tp]}
    if pa.types.is_list(tp) or pa.types.is_large_list(tp):
        inner = feature(tp.value_type)
        return {"list": inner["dtype"] if list(inner) == ["dtype"] else
                inner["struct"] if list(inner) == ["struct"] else inner}
    if pa.types.is_null(tp):
        return {"dtype": "null"}
    names = {pa.string(): "string", pa.large_string(): "large_string", pa.bool_(): "bool",
             pa.float64(): "float64", pa.float32(): "float32", pa.float16(): "float16", pa.int64(): "int64",
             pa.int32(): "int32"}
    if tp not in names:
        raise TypeError(f"no dataset card type for Arrow {tp}")
    return {"dtype": names[tp]}


def sample_schema(sidecar: pa.Schema) -> pa.Schema:
    """`KEY.json` as the sidecar's columns type it: every column but lait's `reason`."""
    return pa.schema([f for f in sidecar if f.name != REASON])


def card_features(json_schema: pa.Schema, image_ext: str, members: list[str]) -> list[dict[str, Any]]:
    """The card's `features`: the image, the caption, the sample's JSON, the region arrays named
    in `members`, and the key and tar path `datasets` adds."""
    out: list[dict[str, Any]] = [{"name": image_ext, "dtype": "image"}, {"name": "txt", "dtype": "string"},
                                 {"name": "json", **feature(pa.struct(list(json_schema)))}]
    for m in members:
        out.append({"name": m, "list": {"list": REGION_MEMBERS[m]} if m != "labels.npy" else REGION_MEMBERS[m]})
    out += [{"name": "__key__", "dtype": "string"}, {"name": "__url__", "dtype": "string"}]
    return out


def dataset_card(json_schema: pa.Schema, image_ext: str, members: list[str], sizes: dict[str, int]) -> str:
    """The text of `README.md`: the YAML header, then what the folder holds and each JSON key."""
    header = {
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": "*.tar"}]}],
        "dataset_info": {"features": card_features(json_schema, image_ext, members),
                         "splits": [{"name": "train", "num_examples": sum(sizes.values())}]},
        "task_categories": ["image-to-text", "text-to-image"],
        "tags": ["webdataset", "lait"],
    }
    described = {name: what for name, _, what in FIELDS}
    rows = "\n".join(f"| `{f.name}` | `{f.type}` | {described.get(f.name, 'a column of the URL list')} |"
                     for f in json_schema)
    regions = (f"\nRegion features from stage 4: {', '.join(f'`KEY.{m}`' for m in members)}.\n"
               if members else "")
    return (f"---\n{yaml.safe_dump(header, sort_keys=False, allow_unicode=True)}---\n\n"
            f"# Image-text shards written by lait\n\n"
            f"{sum(sizes.values())} samples in {len(sizes)} WebDataset tars (`NNNNN.tar`): `KEY.{image_ext}`, "
            f"`KEY.txt` (the caption) and `KEY.json`. Beside them, img2dataset's Parquet sidecars and "
            f"`NNNNN_stats.json`, open_clip's `sizes.json`, DataComp's `uids.npy` and lait's `stats.json`.\n"
            f"{regions}\n"
            f"`datasets.load_dataset(\"PATH/TO/THIS/FOLDER\")`, or a Hub repository holding it, takes the "
            f"features from this card; `load_dataset(\"webdataset\", data_files=...)` types them from the "
            f"first five samples instead, and fails when none of those has a face.\n\n"
            f"| `KEY.json` key | Arrow type | what |\n|---|---|---|\n{rows}\n")
