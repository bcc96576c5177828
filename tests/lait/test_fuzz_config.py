"""Fuzz: any YAML file and any `--set` given to a command's config ends in a config or a
one-line ConfigError (see `tests/kit/fuzz.py` (`config_loader`))."""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis")
import yaml  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st

from kit.fuzz import config_loader, config_paths, config_seeds, mutate  # noqa: E402
from lait.train.config import FinetuneConfig, PretrainConfig  # noqa: E402

pytestmark = pytest.mark.fuzz

EDITS = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=6)
KEYS = st.sampled_from(["stages", "data", "regions", "source", "shards", "steps", "lr", "optim", "tasks", "min_side",
                        "languages", "seeds", "out", "min_score", "model", "filter", "build", "0", "batch_size",
                        "patch_grid", "betas", "x"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["1e-4", ".inf", "-.inf", ".nan", "0x1F", "~", "[]"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(KEYS, inner, max_size=4)), max_leaves=12)
PATHS = st.one_of(st.sampled_from(config_paths(PretrainConfig) + config_paths(FinetuneConfig)),
                  st.lists(KEYS, min_size=1, max_size=4).map(".".join))


@given(st.sampled_from(config_seeds()), EDITS)
def test_mutated_config_files(tmp_path_factory, seed, edits):
    config_loader(mutate(seed, edits), workdir=tmp_path_factory.getbasetemp())


@given(st.dictionaries(KEYS, VALUES, max_size=6))
def test_generated_settings(tmp_path_factory, data):
    config_loader(yaml.safe_dump(data).encode(), workdir=tmp_path_factory.getbasetemp())


# What follows `--set KEY=` on a command line: YAML flow text.
SET_VALUES = st.one_of(st.sampled_from([".inf", "-.inf", ".nan", "1e400", "-1", "0", "3.5", "true", "null", "[]", "{}",
                                        "[1, 2]", "[a, {b: 1}]", "abc", "'x'", "1e-4", "0x10", "{lr: fast}", "[", "!!binary x"]),
                       st.integers(-2**70, 2**70).map(str), st.text(max_size=12))


@given(st.lists(st.tuples(PATHS, SET_VALUES), min_size=1, max_size=3))
def test_generated_set_overrides(tmp_path_factory, assignments):
    overrides = [f"{path}={value}" for path, value in assignments]
    config_loader(config_seeds()[0], overrides, workdir=tmp_path_factory.getbasetemp())


@given(st.binary(max_size=300))
def test_random_bytes(tmp_path_factory, data):
    config_loader(data, workdir=tmp_path_factory.getbasetemp())
