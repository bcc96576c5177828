"""Acceptance on the built-in local web: `lait demo` from crawl to shards, against the ground
truth, and a second run that reuses everything. Slow: it crawls, cleans and scores (the demo
scorer is built once per machine and cached by `scoring`)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("lait.crawler.run")
pytest.importorskip("lait.scoring.pipeline")
pytest.importorskip("lait.filters.text_stage")

from lait.app.demo import DemoConfig, run_demo  # noqa: E402
from lait.testkit.groundtruth import evaluate_files  # noqa: E402


@pytest.mark.slow
def test_demo_matches_ground_truth_and_resumes(tmp_path, capsys):
    out = tmp_path / "demo"
    cfg = DemoConfig(out=str(out), pages=40, workers=2, port=0, progress=False)
    assert run_demo(cfg) == 0
    printed = capsys.readouterr().out
    assert f"report: {out / 'report.html'}" in printed
    res = evaluate_files(out / "work" / "shards", out / "ground_truth.json")
    assert res["precision"] >= 0.95, res["wrong_captions"]
    assert res["coverage"] >= 0.9, res["missing"]
    assert res["duplicated"] == [] and res["unwanted"] == []
    tars = {p.name: p.stat().st_mtime_ns for p in (out / "work" / "shards").glob("*.tar")}
    assert run_demo(cfg) == 0
    assert "reusing the finished crawl" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in (out / "work" / "shards").glob("*.tar")} == tars
    assert json.loads((out / "work" / "shards" / "stats.json").read_text())["samples"] == res["kept"]
