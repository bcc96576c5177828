"""The demo scorer is a CLIP trained from scratch on purpose: its build says so once, in lait's
words, and never with open_clip's "No pretrained weights loaded ... Model initialized randomly"
(the README promises no silent random weights; these are neither silent nor an accident)."""

from __future__ import annotations

import logging

import pytest


def test_the_demo_scorer_build_says_once_that_it_starts_from_random_weights(tmp_path, caplog):
    pytest.importorskip("open_clip")
    from lait.testkit.demo_scorer import train_demo_model

    with caplog.at_level(logging.INFO):
        train_demo_model(tmp_path / "model", steps=1, n_images=32, batch=8, n_junk=4)
        logging.getLogger().warning("a root warning after the build")  # the filter is gone again
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "initialized randomly" in m or "no CLIP weights" in m], messages
    ours = [r for r in caplog.records if r.name.startswith("lait") and "from scratch" in r.getMessage()]
    assert len(ours) == 1, messages
    assert "a root warning after the build" in messages
    assert (tmp_path / "model" / "open_clip_model.safetensors").exists()
