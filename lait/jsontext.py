"""JSON text of Arrow columns, a column at a time, as Python's `json` writes each value.

The text is what `json.JSONEncoder(ensure_ascii=False)` gives for the same Python value (the
default separators `", "` and `": "`), so that records assembled here are byte-identical to
records encoded one by one: strings keep their non-ASCII characters and escape only `"`, `\\`
and the control characters below U+0020; floats are Python's `repr`; null is `null`.

Most strings need no escape at all: they are quoted by Arrow's string kernels, and only the
few that hold a character to escape go through `json.encoder.encode_basestring`.
"""

from __future__ import annotations

from json.encoder import encode_basestring

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# What `encode_basestring` escapes (RE2 syntax): a quote, a backslash, a control character.
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'
_QUOTE = pa.scalar('"', pa.string())


def strings(values: pa.Array, null: str | None = "null") -> pa.Array:
    """Each string as JSON text; a null as `null` (or `null=""`: as the empty string "")."""
    values = values.cast(pa.string())
    if values.null_count and null == "":
        values = pc.fill_null(values, "")
    out = pc.binary_join_element_wise(_QUOTE, values, _QUOTE, "")
    escape = pc.match_substring_regex(values, _NEEDS_ESCAPE)
    if pc.any(escape).as_py():
        where = np.flatnonzero(escape.fill_null(False).to_numpy(zero_copy_only=False))
        text = values.take(pa.array(where)).to_pylist()
        out = pc.replace_with_mask(out, escape.fill_null(False), pa.array([encode_basestring(t) for t in text],
                                                                              pa.string()))
    if out.null_count:  # null values (null="null")
        out = pc.fill_null(out, "null")
    return out


def ints(values: pa.Array) -> pa.Array:
    """Each integer as JSON text (Arrow's decimal text is Python's `str`); a null as `null`."""
    return pc.fill_null(values.cast(pa.string()), "null") if values.null_count else values.cast(pa.string())


_SPECIAL = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}  # as `json` writes them (allow_nan)


def floats(values: pa.Array | list[float | None]) -> pa.Array:
    """Each float as Python's `repr` (Arrow's own text differs: `1` for 1.0); a null as `null`;
    NaN and the infinities as `json` writes them when it allows them."""
    values = values.to_pylist() if isinstance(values, (pa.Array, pa.ChunkedArray)) else values
    text = ["null" if v is None else float.__repr__(v) for v in values]
    if any(t in _SPECIAL for t in text):
        text = [_SPECIAL.get(t, t) for t in text]
    return pa.array(text, pa.string())


def lists(items: pa.Array, lengths: np.ndarray) -> pa.Array:
    """JSON arrays: the JSON text of every item (`items`, flattened, in order), `lengths[i]` of
    them in array i."""
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), items), ", ")
    return pc.binary_join_element_wise("[", joined, "]", "")


def concat(*pieces: pa.Array | str) -> pa.Array:
    """Element-wise concatenation of JSON text columns and literal text (`str`)."""
    return pc.binary_join_element_wise(*(pa.scalar(p, pa.string()) if isinstance(p, str) else p for p in pieces),
                                       "")
