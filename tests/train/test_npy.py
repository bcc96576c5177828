"""The trainer's `.npy` reader: numpy's arrays exactly, never an unpickled object."""

from __future__ import annotations

import io

import numpy as np
import pytest

from lait.train.data import load_npy


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


@pytest.mark.parametrize("array", [
    np.random.default_rng(0).normal(size=(36, 2048)).astype(np.float16),
    np.arange(20, dtype=np.int64).reshape(4, 5),
    np.ones((), np.int32),
    np.zeros((0, 4), np.float32),
    np.array([1.5, -2.0], dtype=">f4"),
    np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    np.array([True, False]),
    np.arange(24, dtype=np.uint8).reshape(2, 3, 4),
], ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_reads_what_numpy_reads(array):
    raw = _npy(array)
    got, want = load_npy(raw), np.load(io.BytesIO(raw), allow_pickle=False)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_objects_and_cut_arrays_are_refused():
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle"):
        load_npy(buf.getvalue())
    raw = _npy(np.arange(10, dtype=np.int64))
    with pytest.raises(ValueError):
        load_npy(raw[:-8])  # a truncated member: numpy's own error, not a shorter array
