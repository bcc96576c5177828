"""lait.jsontext: JSON text of Arrow columns, the same text as Python's `json` for each value."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from lait import jsontext as jt

ENCODER = json.JSONEncoder(ensure_ascii=False)
STRINGS = ["plain", "", 'a "quoted" word', "back\\slash", "tab\tnew\nline\r", "bell\x07 nul\x00 us\x1f",
           "déjà vu ✓ 😀", "\u2028 line separator", "del \x7f", '\\"', None]


def test_strings_are_what_json_writes():
    got = jt.strings(pa.array(STRINGS, pa.string())).to_pylist()
    assert got == [ENCODER.encode(s) for s in STRINGS]


def test_a_null_string_can_be_written_as_the_empty_string():
    assert jt.strings(pa.array(["a", None], pa.string()), null="").to_pylist() == ['"a"', '""']


@pytest.mark.parametrize("values", [[0.1, 1.0, -0.25, 1e-05, 1e16, 0.30000000000000004, 123456.789, None],
                                    [float(x) for x in np.linspace(-3, 3, 17)]])
def test_floats_are_pythons_repr(values):
    assert jt.floats(pa.array(values, pa.float64())).to_pylist() == [ENCODER.encode(v) for v in values]


def test_nan_and_the_infinities_are_what_json_writes_when_it_allows_them():
    values = [float("nan"), float("inf"), -float("inf"), 0.5]
    assert jt.floats(pa.array(values, pa.float64())).to_pylist() == [ENCODER.encode(v) for v in values]


def test_ints_and_nulls():
    values = [0, -7, 2**40, None]
    assert jt.ints(pa.array(values, pa.int64())).to_pylist() == [ENCODER.encode(v) for v in values]


def test_lists_and_concat_give_json_arrays_and_objects():
    rows = [["a", 'b"c'], [], ["ü"]]
    items = jt.strings(pa.array([s for r in rows for s in r], pa.string()))
    arrays = jt.lists(items, np.array([len(r) for r in rows]))
    assert arrays.to_pylist() == [ENCODER.encode(r) for r in rows]
    objects = jt.concat('{"x": ', arrays, ', "n": ', jt.ints(pa.array([1, 2, 3])), "}")
    assert objects.to_pylist() == [ENCODER.encode({"x": r, "n": n}) for r, n in zip(rows, [1, 2, 3])]
