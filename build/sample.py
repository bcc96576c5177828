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
from typing import Any

import numpy as np
import pyarrow as pa

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
    ("sha256", pa.string(), "SHA-256 of the image bytes as fetched"),
    ("original_format", pa.string(), "the fetched image's format (JPEG, PNG, WEBP, ...)"),
    ("phash", pa.string(), "64-bit perceptual hash of the image, 16 hex digits"),
    ("punsafe", pa.float64(), "probability that the image is unsafe (stage 2's model, as LAION's punsafe); "
                              "-1.0 when no model scored it"),
    ("face_bboxes", pa.list_(pa.list_(pa.float64())), "faces stage 2 found, img2dataset's form: [x0, y0, x1, y1] "
                                                      "normalised to the image as fetched; blurred in the tar unless "
                                                      "built with --no-blur-faces; [] for none (or not searched)"),
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
        "exif": _text(v["exif"]), "sha256": _text(v["sha256"]), "original_format": _text(v["original_format"]),
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
    arr = np.array([(int(u[:16], 16), int(u[16:32], 16)) for u in uids], UID_DTYPE)
    arr.sort()
    return arr


def array_to_uids(arr: np.ndarray) -> list[str]:
    return [f"{int(hi):016x}{int(lo):016x}" for hi, lo in arr.tolist()]
