"""The fixed sample schema (build/sample.py): every key, one type, the same in KEY.json and the
sidecar, whatever order readers meet the samples in."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from kit import build_data as data  # noqa: E402
from lait.build.config import BuildConfig
from lait.build.pipeline import build
from lait.build.sample import FIELDS, KEYS, SIDECAR, array_to_uids, check_sample, make_sample, sample_uid


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("work")
    data.make_work(root)
    assert build(BuildConfig(work=str(root), workers=1, progress=False, samples_per_shard=16)).ok
    return root / "shards"


def members(tar: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(tar) as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]


def samples(shards: Path) -> list[dict]:
    return [json.loads(b) for t in sorted(shards.glob("*.tar")) for n, b in members(t) if n.endswith(".json")]


def test_every_sample_has_every_key_with_its_type(built):
    metas = samples(built)
    assert metas
    for m in metas:
        assert check_sample(m) == [], m["key"]
        assert m["uid"] == sample_uid(m["url"], m["caption"]) and len(m["uid"]) == 32
        assert m["urls"][0] == m["url"] and m["candidates"][0]["text"] == m["caption"]
        assert m["status"] == "success" and m["error_message"] is None
        assert (m["width"], m["height"]) == (m["original_width"], m["original_height"])
    png = next(m for m in metas if m["url"].endswith("photo.png"))
    assert png["original_format"] == "PNG" and png["lang"] == "en" and png["license"] == ""
    assert png["pretrained"] == "" and png["exif"] == "{}"  # pretrained None in scored/: ""


def test_sidecar_has_the_same_fields_and_the_failed_sample(built):
    table = pq.read_table(sorted(built.glob("*.parquet")))
    assert table.schema.names == KEYS + ["reason"] and table.schema.equals(SIDECAR)
    rows = table.to_pylist()
    by_key = {m["key"]: m for m in samples(built)}
    for r in rows:
        if r["status"] == "success":
            assert r.pop("reason") is None and r == by_key[r["key"]]
    failed = [r for r in rows if r["status"] != "success"]
    assert [(r["url"].rsplit("/", 1)[1], r["status"], r["reason"]) for r in failed] == \
        [("broken.png", "failed_to_resize", "build/unreadable")]
    assert failed[0]["error_message"] and failed[0]["width"] is None and failed[0]["original_width"] == 400
    stats = {p.name: json.loads(p.read_text()) for p in built.glob("*_stats.json")}
    assert sorted(stats) == [f"{p.stem}_stats.json" for p in sorted(built.glob("*.tar"))]
    assert sum(s["successes"] for s in stats.values()) == len(by_key)
    assert sum(s["failed_to_resize"] for s in stats.values()) == 1
    assert all(s["count"] == s["successes"] + s["failed_to_download"] + s["failed_to_resize"]
               for s in stats.values())


def test_uids_npy_is_a_datacomp_subset_file_of_the_samples(built):
    arr = np.load(built / "uids.npy", allow_pickle=False)
    assert arr.dtype == np.dtype("u8,u8") and arr.tolist() == sorted(arr.tolist())
    assert sorted(array_to_uids(arr)) == sorted(m["uid"] for m in samples(built))


def test_huggingface_infers_the_same_types_in_any_order(built, tmp_path):
    """HF `datasets` types every column from the first five samples of the first tar. On main a
    `duplicates: []` there made a null column, and a later sample with duplicates broke the
    load; here the five poorest samples (no duplicates, fewest candidates) go first."""
    datasets = pytest.importorskip("datasets")
    by_key: dict[str, list[tuple[str, bytes]]] = {}
    for t in sorted(built.glob("*.tar")):
        for name, body in members(t):
            by_key.setdefault(name.split(".", 1)[0], []).append((name, body))
    meta = {k: json.loads(next(b for n, b in v if n.endswith(".json"))) for k, v in by_key.items()}
    order = sorted(by_key, key=lambda k: (meta[k]["n_duplicates"], meta[k]["n_candidates"], k))
    assert meta[order[0]]["n_duplicates"] == 0 and meta[order[-1]]["n_duplicates"] > 0
    tar_path = tmp_path / "00000.tar"
    with tarfile.open(tar_path, "w") as tf:
        for k in order:
            for name, body in by_key[k]:
                info = tarfile.TarInfo(name)
                info.size = len(body)
                tf.addfile(info, io.BytesIO(body))
    ds = datasets.load_dataset("webdataset", data_files={"train": [str(tar_path)]}, split="train",
                               cache_dir=str(tmp_path / "hf"))
    assert len(ds) == len(order)
    assert list(ds.features["json"]) == KEYS
    assert ds[len(order) - 1]["json"]["urls"][1:] == meta[order[-1]]["urls"][1:]


def test_make_sample_refuses_unknown_and_missing_keys():
    meta = {"key": "0", "url": "u", "caption": "c", "status": "success", "width": 1, "height": 1,
            "original_width": 1, "original_height": 1, "exif": "{}", "sha256": hashlib.sha256(b"").hexdigest(),
            "fetched_sha256": hashlib.sha256(b"x").hexdigest(), "original_format": "JPEG", "phash": "0" * 16, "punsafe": 0.01, "face_bboxes": [[0.1, 0.2, 0.3, 0.4]],
            "page_url": "p", "score": 0.5,
            "source": "alt",
            "model": "m", "pages": 1, "urls": ["u"], "n_duplicates": 0, "n_candidates": 1,
            "candidates": [{"text": "c", "source": "alt", "lang": None, "score": 0.5, "page_url": "p"}]}
    sample = make_sample(meta)
    assert list(sample) == [name for name, _, _ in FIELDS] and check_sample(json.loads(json.dumps(sample))) == []
    assert sample["candidates"][0]["lang"] == "" and sample["license"] == ""
    with pytest.raises(ValueError, match="unknown"):
        make_sample({**meta, "alternatives": []})
    with pytest.raises(ValueError, match="missing"):
        make_sample({k: v for k, v in meta.items() if k != "pages"})
    with pytest.raises(ValueError, match="empty"):
        make_sample({**meta, "urls": []})


def test_docs_list_every_key_of_the_schema(repo_root):
    doc = (repo_root / "docs" / "shards.md").read_text()
    missing = [name for name in KEYS if f"| `{name}` |" not in doc]
    assert missing == []


# -- Samples made by column (PlannedSamples) are the samples made one by one ---------------------
NASTY = ['say "hi"', "back\\slash", "tab\tnew\nline", "ctl\x01", "déjà ✓ 😀", "", "\u2028"]


def _metas(built: Path) -> list[str]:
    from lait.workdir import WorkDir

    metas = WorkDir(built.parent).read("build_plan").column("meta").to_pylist()
    out = []
    for i, text in enumerate(metas * 3):  # as planned, then with the values a plan may hold
        m = json.loads(text)
        if i >= len(metas):
            j = i % len(NASTY)
            m["caption"] += NASTY[j]
            m["candidates"][0]["text"] = NASTY[(j + 1) % len(NASTY)]
            m["candidates"][-1]["lang"] = None
            m.update(lang=None, license=[None, "cc-by"][i % 2], pretrained=None, punsafe=[-1.0, 1e-05, 0.5][i % 3],
                     score=[0.1, 1.0, 0.30000000000000004][i % 3], image_license=None, image_license_from=None,
                     face_bboxes=[[0.1, 0.25, 1.0, 0.5]] * (i % 3), urls=m["urls"] + [NASTY[j]])
        out.append(json.dumps(m, ensure_ascii=False, sort_keys=True))
    return out


def test_samples_made_by_column_are_byte_identical_to_samples_made_one_by_one(built):
    import pyarrow as pa

    from lait.build.sample import PlannedSamples, read_metas, sample_json

    metas = _metas(built)
    n = len(metas)
    keys = [f"{i:09d}" for i in range(n)]
    dims = [[17 + i, 5 + 2 * i, 30 + i, 9 + i] for i in range(n)]
    exif = ["{}" if i % 2 else json.dumps({"Image Make": NASTY[i % len(NASTY)]}, ensure_ascii=False) for i in range(n)]
    # The digest of the bytes shipped: the stored one, or a re-encode's (every other sample).
    shipped = [json.loads(m)["sha256"] if i % 2 else hashlib.sha256(b"%d" % i).hexdigest()
               for i, m in enumerate(metas)]
    planned = PlannedSamples(read_metas(pa.array(metas)), keys)
    # The faces the shard pass found in the picture it wrote: none, one, two (nasty floats too).
    faces = [[[], [[0.1, 0.2, 0.3, 0.4]], [[0.0, 0.0, 1.0, 1.0], [0.1234, 1e-05, 0.5, 0.3333]]][i % 3] for i in range(n)]
    one_by_one = [make_sample({**json.loads(m), "sha256": sha, "face_bboxes": f}, key=k, status="success", width=w,
                              height=h, original_width=ow, original_height=oh, exif=e)
                  for m, k, (w, h, ow, oh), e, sha, f in zip(metas, keys, dims, exif, shipped, faces)]
    for i in range(n):
        assert planned.json(i, *dims[i], exif[i], shipped[i], faces[i]) == sample_json(one_by_one[i]), metas[i]
    rows = [i for i in range(n) if i % 3]  # a failed sample is not among them
    table = planned.sidecar(rows, *[[dims[i][k] for i in rows] for k in range(4)], [exif[i] for i in rows],
                            [shipped[i] for i in rows], [faces[i] for i in rows])
    assert table.schema == SIDECAR
    assert table.to_pylist() == [{**one_by_one[i], "reason": None} for i in rows]


@pytest.mark.parametrize("change", [{"extra": {"list_id": 3}}, {"lang": 5}, {"score": None}, {"urls": []},
                                    {"candidates": []}, {"error_message": "x"}])
def test_metadata_the_columns_do_not_take_is_left_to_make_sample(built, change):
    import pyarrow as pa

    from lait.build.sample import read_metas

    metas = _metas(built)[:3]
    assert read_metas(pa.array(metas)) is not None
    m = {**json.loads(metas[1]), **change}
    assert read_metas(pa.array([metas[0], json.dumps(m, sort_keys=True), metas[2]])) is None


def test_plan_metadata_is_the_sorted_json_of_its_object(built):
    """`plan_meta` builds its dicts in sorted key order and encodes them without sorting: the
    text must be what sorting the keys gives."""
    from lait.workdir import WorkDir

    for text in WorkDir(built.parent).read("build_plan").column("meta").to_pylist():
        assert text == json.dumps(json.loads(text), ensure_ascii=False, sort_keys=True)


def test_uid_array_is_sorted_by_high_then_low_word_and_reads_back():
    from lait.build.sample import uids_to_array

    uids = ["f" * 16 + "0" * 16, "0" * 32, "8" + "0" * 31, "0" * 16 + "f" * 16, "0" * 32, "7" + "f" * 31]
    arr = uids_to_array(uids)
    assert [(int(hi), int(lo)) for hi, lo in arr.tolist()] == sorted((int(u[:16], 16), int(u[16:], 16)) for u in uids)
    assert array_to_uids(arr) == sorted(uids)
    short = ["AB" * 16, "ab" * 15]  # not all 32 digits: parsed one by one, as before
    assert [(int(hi), int(lo)) for hi, lo in uids_to_array(short).tolist()] == \
        sorted((int(u[:16], 16), int(u[16:32], 16)) for u in short)


def test_the_folder_card_types_every_member_as_datasets_itself_would(built):
    """README.md's features are `datasets`' own YAML of the sample schema (the same text it writes
    for a Hub card), and read back to the types of the JSON, the image, caption and regions."""
    datasets = pytest.importorskip("datasets")
    import pyarrow as pa
    import yaml as pyyaml

    from lait.build.card import card_features, sample_schema

    header = pyyaml.safe_load((built / "README.md").read_text().split("---\n")[1])
    assert header["configs"][0]["data_files"] == [{"split": "train", "path": "*.tar"}]
    assert header["dataset_info"]["splits"][0]["num_examples"] == len(samples(built))
    features = datasets.Features._from_yaml_list(header["dataset_info"]["features"])
    expected = datasets.Features.from_arrow_schema(pa.schema([pa.field("json", pa.struct(
        [f for f in SIDECAR if f.name != "reason"]))]))
    assert features["json"] == expected["json"] and list(features["json"]) == KEYS
    assert isinstance(features["jpg"], datasets.Image) and features["txt"] == datasets.Value("string")
    extra = pa.schema(list(SIDECAR) + [pa.field("n", pa.int64()), pa.field("ok", pa.bool_()),
                                       pa.field("w", pa.float64())])
    with_regions = card_features(sample_schema(extra), "webp", ["regions.npy", "boxes.npy", "labels.npy"])
    ours = datasets.Features._from_yaml_list(with_regions)
    theirs = datasets.Features.from_arrow_schema(pa.schema([
        pa.field("json", pa.struct([f for f in extra if f.name != "reason"])),
        pa.field("regions.npy", pa.list_(pa.list_(pa.float16()))),
        pa.field("boxes.npy", pa.list_(pa.list_(pa.float32()))), pa.field("labels.npy", pa.list_(pa.int32()))]))
    assert all(ours[k] == theirs[k] for k in theirs) and isinstance(ours["webp"], datasets.Image)
    assert with_regions[2] == theirs._to_yaml_list()[0]  # the same YAML text as datasets writes
