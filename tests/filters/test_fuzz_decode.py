"""Fuzz: stage 2's decode path on mutated images ends in a kept image or an `ImageRejected` with
a registered filter rule, never in the catch-all filter/error (see `tests/kit/fuzz.py` (`image_decode`))."""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st

from kit.fuzz import image_decode, image_seeds, mutate  # noqa: E402

pytestmark = pytest.mark.fuzz

SEEDS = image_seeds()
EDITS = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=6)
MIMES = st.sampled_from(["image/jpeg", "image/png", "image/svg+xml", None, "text/html"])


def test_the_seeds_are_kept():
    assert [image_decode(s) for s in SEEDS] == [None] * len(SEEDS)


@given(st.sampled_from(SEEDS), EDITS, MIMES)
def test_mutated_images(seed, edits, mime):
    image_decode(mutate(seed, edits), mime)


@given(st.binary(max_size=512), MIMES)
def test_random_bytes(data, mime):
    image_decode(data, mime)
