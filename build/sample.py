"""The fixed schema of a shard sample: every key of `KEY.json`, one type each (docs/shards.md).

Readers that infer types from the first rows (Hugging Face `datasets` reads five samples,
pandas and polars a few more) see every key with its full type in any first row, so:

- every key is present in every sample;
- no value that can be a string is ever null: a missing string is "" (`lang` undetected,
  `pretrained` for a local checkpoint, `license` when the page declared none);
  `error_message` is null in every sample of a tar, which holds successes only;
- no list is ever empty: `urls` starts with the sample's own URL, `candidates` with its
  caption's candidate.

The Parquet sidecar has the same fields as Arrow columns (`SIDECAR`), plus the failed samples
of the shard with their `status` and `error_message`, as img2dataset writes it, and lait's
`reason` for each failure. A build from URL lists appends the lists' extra columns
(`--save-additional-columns`) to every sample and sidecar row, after the fixed fields, each
with one type (`lait.build.books`).
"""

from __future__ import annotations

import hashlib
import json
from json.encoder import encode_basestring
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

CANDIDATE = pa.struct([
    pa.field("text", pa.string()),
    pa.field("source", pa.string()),
    pa.field("lang", pa.string()),
    pa.field("score", pa.float64()),
    pa.field("page_url", pa.string()),
])

# Key, Arrow type, and what it holds: the order of KEY.json and of the sidecar's columns.
FIELDS: list[tuple[str, pa.DataType, str]] = [
    ("key", pa.string(), "the sample's key in its tar: shard number (5 digits), then index"),
    ("uid", pa.string(), "DataComp-style id: 32 hex digits, MD5 of the URL, a tab and the caption"),
    ("url", pa.string(), "the image URL"),
    ("caption", pa.string(), "the chosen text, also KEY.txt"),
    ("status", pa.string(), "success in a tar; failed_to_download or failed_to_resize in a sidecar"),
    ("error_message", pa.string(), "null in a tar; why the sample failed in a sidecar"),
    ("width", pa.int64(), "width of the image in the tar"),
    ("height", pa.int64(), "height of the image in the tar"),
    ("original_width", pa.int64(), "width of the image as fetched"),
    ("original_height", pa.int64(), "height of the image as fetched"),
    ("exif", pa.string(), "the EXIF tags as fetched, a JSON object of strings as text; \"{}\" for none"),
    ("sha256", pa.string(), "SHA-256 of the image bytes in the tar (KEY.jpg, ...): what a reader checks them by"),
    ("fetched_sha256", pa.string(), "SHA-256 of the image file as fetched (provenance, hash lists); the same as "
                                    "sha256 when the file was shipped as it came"),
    ("original_format", pa.string(), "the fetched image's format (JPEG, PNG, WEBP, ...)"),
    ("phash", pa.string(), "64-bit perceptual hash of the image, 16 hex digits"),
    ("punsafe", pa.float64(), "probability that the image is unsafe (stage 2's model, as LAION's punsafe); "
                              "-1.0 when no model scored it"),
    ("face_bboxes", pa.list_(pa.list_(pa.float64())), "faces found in the picture in the tar (searched as it "
                                                      "was written), img2dataset's form: [x0, y0, x1, y1] normalised "
                                                      "to that picture; blurred in the tar unless built with "
                                                      "--no-blur-faces; [] for none (or built with --face-model none)"),
    ("page_url", pa.string(), "the page the caption was found on"),
    ("score", pa.float64(), "image-text similarity of the caption (stage 4)"),
    ("source", pa.string(), "where on the page the caption came from: figcaption, alt, title, og, aria, context"),
    ("lang", pa.string(), "the caption's detected language; \"\" when undetected"),
    ("license", pa.string(), "the licence the caption's page declared, which need not be the image's; \"\" when none"),
    ("image_license", pa.string(), "the licence declared for the image itself: by its page on its figure, or in "
                                   "its own file (XMP, IPTC); \"\" when none"),
    ("image_license_from", pa.string(), "where image_license comes from: figure, file; \"\" when none"),
    ("model", pa.string(), "the scoring model"),
    ("pretrained", pa.string(), "the scoring model's weights tag; \"\" for a local checkpoint"),
    ("pages", pa.int64(), "distinct pages that show the picture"),
    ("urls", pa.list_(pa.string()), "the sample's URL, then up to 16 other URLs of the same picture"),
    ("n_duplicates", pa.int64(), "other URLs of the same picture that were merged into this sample"),
    ("candidates", pa.list_(CANDIDATE), "the scored texts, best first (the caption), one per distinct text"),
    ("n_candidates", pa.int64(), "distinct texts of the picture (candidates lists at most max_candidates)"),
]

KEYS = [name for name, _, _ in FIELDS]
# The sidecar's column beside img2dataset's status: lait's `stage/rule` of a failed row.
REASON = "reason"
SIDECAR = pa.schema([pa.field(name, tp) for name, tp, _ in FIELDS] + [pa.field(REASON, pa.string())])
STRINGS = {name for name, tp, _ in FIELDS if tp == pa.string()} - {"error_message"}
INTS = {name for name, tp, _ in FIELDS if pa.types.is_integer(tp)}
CANDIDATE_KEYS = [f.name for f in CANDIDATE]

# img2dataset's vocabulary of a sample's status.
SUCCESS, FAILED_TO_DOWNLOAD, FAILED_TO_RESIZE = "success", "failed_to_download", "failed_to_resize"


def sample_uid(url: str, caption: str) -> str:
    """DataComp's form of a sample id: 128 bits as 32 lower-case hex digits, over the URL and
    the caption (a tab between them, so that no two (url, caption) pairs share their input)."""
    return hashlib.md5(f"{url}\t{caption}".encode("utf-8")).hexdigest()


def _candidate(c: dict[str, Any]) -> dict[str, Any]:
    return {"text": c["text"], "source": c["source"], "lang": c.get("lang") or "",
            "score": float(c["score"]), "page_url": c["page_url"]}


_OPTIONAL = ("error_message", "lang", "license", "image_license", "image_license_from", "pretrained")
_KEYSET = frozenset(KEYS)


def _text(v: Any) -> str:
    return "" if v is None else v if type(v) is str else str(v)


def _int(v: Any) -> int | None:
    return v if v is None or type(v) is int else int(v)


def make_sample(meta: dict[str, Any], **image: Any) -> dict[str, Any]:
    """The sample's record in schema order from the plan's metadata (`build.aggregate.plan_meta`)
    and what writing the image decided (`key`, `status`, `width`, ...); raises ValueError when a
    key is left over or missing, so that the schema cannot drift silently.

    Called once per sample of every shard: the record is one dict display in schema order (a
    loop over the keys with a type test each cost as much as decoding the metadata)."""
    v = {**meta, **image}
    columns = v.pop("extra", None) or {}  # the URL list's extra columns
    v["uid"] = sample_uid(v["url"], v["caption"])
    for name in _OPTIONAL:
        v.setdefault(name, None)
    if v.keys() != _KEYSET:
        missing, extra = _KEYSET - v.keys(), v.keys() - _KEYSET
        raise ValueError(f"sample {v.get('key')}: keys missing {sorted(missing)}, unknown {sorted(extra)}")
    out = {
        "key": _text(v["key"]), "uid": _text(v["uid"]), "url": _text(v["url"]), "caption": _text(v["caption"]),
        "status": _text(v["status"]), "error_message": v["error_message"],
        "width": _int(v["width"]), "height": _int(v["height"]),
        "original_width": _int(v["original_width"]), "original_height": _int(v["original_height"]),
        "exif": _text(v["exif"]), "sha256": _text(v["sha256"]), "fetched_sha256": _text(v["fetched_sha256"]),
        "original_format": _text(v["original_format"]),
        "phash": _text(v["phash"]), "punsafe": float(v["punsafe"]),
        "face_bboxes": [[float(x) for x in b] for b in v["face_bboxes"] or ()],
        "page_url": _text(v["page_url"]), "score": float(v["score"]), "source": _text(v["source"]),
        "lang": _text(v["lang"]), "license": _text(v["license"]), "image_license": _text(v["image_license"]),
        "image_license_from": _text(v["image_license_from"]), "model": _text(v["model"]),
        "pretrained": _text(v["pretrained"]), "pages": _int(v["pages"]), "urls": v["urls"],
        "n_duplicates": _int(v["n_duplicates"]), "candidates": [_candidate(c) for c in v["candidates"]],
        "n_candidates": _int(v["n_candidates"]),
    }
    if not out["urls"] or not out["candidates"]:
        raise ValueError(f"sample {out['key']}: urls and candidates must not be empty")
    return with_extra(out, columns) if columns else out


def with_extra(record: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`record` with the list's extra columns after its fixed keys; ValueError for a column named
    like a fixed key (`lait download` refuses those, as img2dataset does)."""
    clash = sorted(set(extra) & (set(KEYS) | {REASON}))
    if clash:
        raise ValueError(f"extra columns {clash} are named like fields of the sample")
    record.update(extra)
    return record


def failed_record(key: str, status: str, error_message: str, *, url: str | None, caption: str | None,
                  page_url: str | None, extra: dict[str, Any]) -> dict[str, Any]:
    """The sidecar row of a list row that became no sample: what the list said of it, its
    status and message; every measure of an image it never became is null."""
    values: dict[str, Any] = {name: None for name in KEYS}
    values.update(key=key, uid=sample_uid(url or "", caption or ""), url=url or "", caption=caption or "",
                  status=status, error_message=error_message, page_url=page_url or "",
                  urls=[url] if url else [], candidates=[])
    return with_extra(values, extra)


NOT_MEASURED = -1.0  # punsafe of an image no model scored: a number, so that readers type the key


def punsafe_value(value: Any) -> float:
    """A sample's punsafe: stage 2's probability, or NOT_MEASURED when it has none."""
    return NOT_MEASURED if value is None else round(float(value), 6)


# Made once (`json.dumps` makes one per call); a sample holds no container twice, so the check
# for circular references, which records every list and dict it enters, is left out.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, check_circular=False)


def sample_json(sample: dict[str, Any]) -> bytes:
    """KEY.json: the sample's record in schema order (UTF-8, no NaN)."""
    return _ENCODER.encode(sample).encode("utf-8")


def check_sample(obj: Any) -> list[str]:
    """What is wrong with a KEY.json object read back against the schema (empty when nothing)."""
    if not isinstance(obj, dict):
        return ["not a JSON object"]
    problems = []
    if list(obj)[:len(KEYS)] != KEYS:  # the list's extra columns may follow
        problems.append(f"keys {list(obj)} are not {KEYS}")
    for name, tp, _ in FIELDS:
        if name not in obj:
            continue
        v = obj[name]
        if name == "error_message":
            ok = v is None
        elif tp == pa.string():
            ok = isinstance(v, str)
        elif pa.types.is_integer(tp):
            ok = isinstance(v, int) and not isinstance(v, bool)
        elif pa.types.is_floating(tp):
            ok = isinstance(v, float)
        elif name == "urls":
            ok = isinstance(v, list) and bool(v) and all(isinstance(u, str) for u in v)
        elif name == "face_bboxes":
            ok = isinstance(v, list) and all(isinstance(b, list) and len(b) == 4
                                             and all(isinstance(x, float) for x in b) for b in v)
        else:  # candidates
            ok = isinstance(v, list) and bool(v) and all(
                isinstance(c, dict) and list(c) == CANDIDATE_KEYS and isinstance(c["score"], float)
                and all(isinstance(c[k], str) for k in CANDIDATE_KEYS if k != "score") for c in v)
        if not ok:
            problems.append(f"{name}={v!r} is not of its type")
    return problems


# -- DataComp subset files ----------------------------------------------------------------------
UID_DTYPE = np.dtype("u8,u8")


def uids_to_array(uids: list[str]) -> np.ndarray:
    """Hex uids as DataComp's subset array: (high, low) u64 pairs in sorted order."""
    if uids and all(len(u) == 32 for u in uids):
        # 32 hex digits each (lait's uids): decoded in one piece and sorted as two u64 columns,
        # not a tuple per uid and a sort of the record array (most of `finish_shard_dir`).
        pairs = np.frombuffer(bytes.fromhex("".join(uids)), ">u8").astype(np.uint64).reshape(-1, 2)
        order = np.lexsort((pairs[:, 1], pairs[:, 0]))
        arr = np.empty(len(uids), UID_DTYPE)
        arr["f0"], arr["f1"] = pairs[order, 0], pairs[order, 1]
        return arr
    arr = np.array([(int(u[:16], 16), int(u[16:32], 16)) for u in uids], UID_DTYPE)
    arr.sort()
    return arr


def array_to_uids(arr: np.ndarray) -> list[str]:
    return [f"{int(hi):016x}{int(lo):016x}" for hi, lo in arr.tolist()]


# -- Samples a batch at a time ------------------------------------------------------------------
# The plan's `meta` (`build.aggregate.plan_meta`) as the columns of a table: what `pyarrow.json`
# reads it into. A field the plan never leaves null is REQUIRED.
META = pa.schema([
    pa.field("candidates", pa.list_(pa.struct([pa.field("lang", pa.string()), pa.field("page_url", pa.string()),
                                               pa.field("score", pa.float64()), pa.field("source", pa.string()),
                                               pa.field("text", pa.string())]))),
    pa.field("caption", pa.string()), pa.field("face_bboxes", pa.list_(pa.list_(pa.float64()))),
    pa.field("fetched_sha256", pa.string()),
    pa.field("height", pa.int64()), pa.field("image_license", pa.string()),
    pa.field("image_license_from", pa.string()), pa.field("key", pa.string()), pa.field("lang", pa.string()),
    pa.field("license", pa.string()), pa.field("model", pa.string()), pa.field("n_candidates", pa.int64()),
    pa.field("n_duplicates", pa.int64()), pa.field("original_format", pa.string()), pa.field("page_url", pa.string()),
    pa.field("pages", pa.int64()), pa.field("phash", pa.string()), pa.field("pretrained", pa.string()),
    pa.field("punsafe", pa.float64()), pa.field("score", pa.float64()), pa.field("sha256", pa.string()),
    pa.field("source", pa.string()), pa.field("status", pa.string()), pa.field("url", pa.string()),
    pa.field("urls", pa.list_(pa.string())), pa.field("width", pa.int64()),
])
_NULLABLE = {"lang", "license", "image_license", "image_license_from", "pretrained"}
REQUIRED = [f.name for f in META if f.name not in _NULLABLE]
_CANDIDATE_REQUIRED = ["page_url", "score", "source", "text"]


def read_metas(metas: pa.Array) -> pa.Table | None:
    """The plan's `meta` texts as a table with the columns of META, parsed by Arrow in one go;
    None when any of them is not what `plan_meta` writes (a key it does not write, such as a URL
    list's `extra`, a value of another type, a null where it writes none): those samples are
    made one by one (`make_sample`), which raises on what it cannot take."""
    from pyarrow import json as pa_json

    if len(metas) == 0 or metas.null_count:
        return None
    text = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(metas)], pa.int32()), metas.cast(pa.string())),
                          "\n")[0].as_buffer()
    try:
        table = pa_json.read_json(pa.BufferReader(text), read_options=pa_json.ReadOptions(
            use_threads=False, block_size=max(1 << 20, text.size + 1)), parse_options=pa_json.ParseOptions(
            explicit_schema=META, unexpected_field_behavior="error"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    table = table.combine_chunks()
    if table.num_rows != len(metas) or any(table.column(n).null_count for n in REQUIRED):
        return None
    cands = table.column("candidates").chunk(0).flatten() if table.num_rows else None
    if cands is not None and any(cands.field(n).null_count for n in _CANDIDATE_REQUIRED):
        return None
    if pc.any(pc.equal(pc.list_value_length(table.column("candidates")), 0)).as_py() \
            or pc.any(pc.equal(pc.list_value_length(table.column("urls")), 0)).as_py():
        return None  # make_sample refuses these with its own message
    if table.column("urls").chunk(0).flatten().null_count or table.column("face_bboxes").chunk(0).flatten().null_count:
        return None
    floats = [table.column("score"), table.column("punsafe"), cands.field("score"),
              table.column("face_bboxes").chunk(0).flatten().flatten()]
    if not all(pc.all(pc.is_finite(f)).as_py() in (True, None) for f in floats):
        return None  # KEY.json has no NaN: make_sample's encoder refuses it
    return table


class PlannedSamples:
    """A shard's planned samples by column (the rows of `read_metas`, with their keys), and the
    parts of each KEY.json that writing the image leaves as they are, made once for the shard.

    `json(i, ...)` puts sample i's record together, byte for byte as `sample_json(make_sample(
    ...))` writes it; `sidecar(rows, ...)` gives the SIDECAR rows of the samples written."""

    def __init__(self, meta: pa.Table, keys: list[str]):
        from lait import jsontext as jt

        col = {name: meta.column(name).combine_chunks() for name in meta.column_names}
        self.col = col
        self.keys = pa.array(keys, pa.string())
        self.uids = pa.array([sample_uid(u, c) for u, c in zip(col["url"].to_pylist(), col["caption"].to_pylist())],
                             pa.string())
        self.sha256: list[str] = col["sha256"].to_pylist()
        # The boxes the plan knew (images_ok's, from another writer than lait's stage 2); the
        # shard pass puts the faces of the picture it writes in their place (`json`, `sidecar`).
        faces = col["face_bboxes"]
        n_faces = pc.list_value_length(faces).to_numpy(zero_copy_only=False)
        self.faces: list[list[list[float]]] = [[] for _ in range(len(meta))] if not n_faces.any() else faces.to_pylist()
        self.texts = {n: pc.fill_null(col[n], "") for n in _NULLABLE}
        # Candidates as the sample writes them: text, source, lang ("" for none), score, page_url.
        cands = col["candidates"]
        flat = cands.flatten()
        self.candidates = pa.StructArray.from_arrays(
            [flat.field("text"), flat.field("source"), pc.fill_null(flat.field("lang"), ""), flat.field("score"),
             flat.field("page_url")], fields=list(CANDIDATE))
        self.n_candidates = pc.list_value_length(cands).to_numpy(zero_copy_only=False)
        c = self.candidates
        cand_json = jt.concat('{"text": ', jt.strings(c.field("text")), ', "source": ', jt.strings(c.field("source")),
                              ', "lang": ', jt.strings(c.field("lang")), ', "score": ', jt.floats(c.field("score")),
                              ', "page_url": ', jt.strings(c.field("page_url")), "}")
        urls = col["urls"]
        # Before the image's measures ("width": ... "sha256": ...) and after them ("fetched_sha256": ...).
        head = jt.concat('{"key": ', jt.strings(self.keys), ', "uid": ', jt.strings(self.uids), ', "url": ',
                         jt.strings(col["url"]), ', "caption": ', jt.strings(col["caption"]),
                         f', "status": "{SUCCESS}", "error_message": null, "width": ')
        tail = jt.concat(
            ', "fetched_sha256": ', jt.strings(col["fetched_sha256"]), ', "original_format": ',
            jt.strings(col["original_format"]),
            ', "phash": ', jt.strings(col["phash"]), ', "punsafe": ', jt.floats(col["punsafe"]), ', "face_bboxes": ')
        after_faces = jt.concat(
            ', "page_url": ', jt.strings(col["page_url"]), ', "score": ', jt.floats(col["score"]),
            ', "source": ', jt.strings(col["source"]), ', "lang": ', jt.strings(self.texts["lang"]), ', "license": ',
            jt.strings(self.texts["license"]), ', "image_license": ', jt.strings(self.texts["image_license"]),
            ', "image_license_from": ', jt.strings(self.texts["image_license_from"]), ', "model": ',
            jt.strings(col["model"]), ', "pretrained": ', jt.strings(self.texts["pretrained"]), ', "pages": ',
            jt.ints(col["pages"]), ', "urls": ',
            jt.lists(jt.strings(urls.flatten()), pc.list_value_length(urls).to_numpy(zero_copy_only=False)),
            ', "n_duplicates": ', jt.ints(col["n_duplicates"]), ', "candidates": ',
            jt.lists(cand_json, self.n_candidates), ', "n_candidates": ', jt.ints(col["n_candidates"]), "}")
        self._head: list[bytes] = head.cast(pa.binary()).to_pylist()
        self._tail: list[bytes] = tail.cast(pa.binary()).to_pylist()
        self._after_faces: list[bytes] = after_faces.cast(pa.binary()).to_pylist()

    def json(self, i: int, width: int, height: int, original_width: int, original_height: int, exif: str,
             sha256: str, faces: list[list[float]]) -> bytes:
        """KEY.json of sample i, a success, with the image's measures, EXIF, digest and faces as
        written."""
        return b"".join((self._head[i], (f'{int(width)}, "height": {int(height)}, "original_width": '
                                         f'{int(original_width)}, "original_height": {int(original_height)}, '
                                         f'"exif": {encode_basestring(exif)}, "sha256": "{sha256}"').encode("utf-8"),
                         self._tail[i], faces_json(faces), self._after_faces[i]))

    def sidecar(self, rows: list[int], width: list[int], height: list[int], original_width: list[int],
                original_height: list[int], exif: list[str], sha256: list[str],
                faces: list[list[list[float]]]) -> pa.Table:
        """The SIDECAR rows of samples `rows`, successes, with their image's measures, EXIF,
        digest and faces."""
        idx = pa.array(rows, pa.int64())
        col = {name: a.take(idx) for name, a in self.col.items() if name != "candidates"}
        texts = {name: a.take(idx) for name, a in self.texts.items()}
        offsets = np.zeros(len(self.n_candidates) + 1, np.int32)
        np.cumsum(self.n_candidates, out=offsets[1:])
        candidates = pa.ListArray.from_arrays(pa.array(offsets), self.candidates, type=pa.list_(CANDIDATE)).take(idx)
        n = len(rows)
        side = {
            **col, **texts, "key": self.keys.take(idx), "uid": self.uids.take(idx),
            "status": pa.array([SUCCESS] * n, pa.string()), "error_message": pa.nulls(n, pa.string()),
            "width": pa.array(width, pa.int64()), "height": pa.array(height, pa.int64()),
            "original_width": pa.array(original_width, pa.int64()),
            "original_height": pa.array(original_height, pa.int64()), "exif": pa.array(exif, pa.string()),
            "sha256": pa.array(sha256, pa.string()),
            "face_bboxes": pa.array(faces, pa.list_(pa.list_(pa.float64()))),
            "candidates": candidates, REASON: pa.nulls(n, pa.string()),
        }
        return pa.table([side[f.name].cast(f.type) for f in SIDECAR], schema=SIDECAR)


def faces_json(faces: list[list[float]] | None) -> bytes:
    """KEY.json's `face_bboxes` text of a sample's boxes, as `sample_json` writes them."""
    return ("[" + ", ".join("[" + ", ".join(float.__repr__(float(v)) for v in b) + "]" for b in faces or ()) + "]"
            ).encode("ascii")
