"""Fuzz: damaged and random archives are read, split and ingested without an exception and
without `ingest_file` reporting a failure of its own (see `tests/kit/fuzz.py` (`warc_reader`))."""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st

from kit.fuzz import mutate, warc_reader, warc_seeds  # noqa: E402

pytestmark = pytest.mark.fuzz

SEEDS = warc_seeds()
EDITS = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=8)


@given(st.sampled_from(SEEDS), EDITS)
def test_mutated_archives(tmp_path_factory, seed, edits):
    warc_reader(mutate(seed, edits), tmp_path_factory.getbasetemp())


@given(st.binary(max_size=1024))
def test_random_bytes(tmp_path_factory, data):
    warc_reader(data, tmp_path_factory.getbasetemp())


@given(st.sampled_from(SEEDS), st.integers(0, 1 << 20))
def test_archives_cut_anywhere(tmp_path_factory, seed, cut):
    warc_reader(seed[: cut % (len(seed) + 1)], tmp_path_factory.getbasetemp())
