"""The `build`, `stats`, `run` and `demo` sub-commands, driven through their argparse parsers."""

from __future__ import annotations

import json

import pytest

from kit import build_data as data  # noqa: E402
from lait.app.cli import build_parser
from lait.config import ConfigError


def cli(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


def test_build_then_stats_from_the_command_line(tmp_path, capsys):
    data.make_work(tmp_path / "w")
    yaml_file = tmp_path / "pipeline.yaml"
    yaml_file.write_text("build:\n  samples_per_shard: 30\n  min_score: 0.1\n")
    assert cli(["build", str(tmp_path / "w"), "--config", str(yaml_file), "--workers", "1", "--no-progress"]) == 0
    sizes = json.loads((tmp_path / "w" / "shards" / "sizes.json").read_text())
    assert len(sizes) == 2  # 42 planned samples, 30 per shard (from the YAML build: section)
    written = (tmp_path / "w" / "_configs" / "build.yaml").read_text()
    assert "min_score: 0.1" in written
    assert cli(["stats", str(tmp_path / "w"), "--html", str(tmp_path / "r.html")]) == 0
    out = capsys.readouterr().out
    assert "build/min_score" in out and (tmp_path / "r.html").stat().st_size > 10_000


def test_run_rejects_unknown_sections_and_settings_before_running(tmp_path):
    data.make_work(tmp_path / "w")
    bad = tmp_path / "bad.yaml"
    bad.write_text("bild: {}\n")
    with pytest.raises(ConfigError, match="unknown sections"):
        cli(["run", str(tmp_path / "w"), "--config", str(bad)])
    bad.write_text("build:\n  samples_per_shart: 3\n")
    with pytest.raises(ConfigError, match="samples_per_shart"):
        cli(["run", str(tmp_path / "w"), "--config", str(bad), "--from", "build"])
    assert not (tmp_path / "w" / "shards").exists()


def test_run_build_step_only(tmp_path):
    data.make_work(tmp_path / "w")
    cfg = tmp_path / "p.yaml"
    cfg.write_text("build: {samples_per_shard: 8}\n")
    assert cli(["run", str(tmp_path / "w"), "--config", str(cfg), "--from", "build", "--workers", "1",
                "--no-progress"]) == 0
    assert len(list((tmp_path / "w" / "shards").glob("*.tar"))) == 6


def test_stats_needs_a_work_directory(tmp_path):
    with pytest.raises(ConfigError, match="lait.json"):
        cli(["stats", str(tmp_path)])


@pytest.mark.parametrize("in_child", [False, True])
def test_a_failing_plan_is_reported_and_a_rerun_finishes(tmp_path, monkeypatch, in_child):
    """Planned here (a small build) or in a forked child (a large one), the plan's error reaches
    the caller (with the child's traceback), nothing is marked done, and the next run plans and
    writes the shards."""
    from lait.build import pipeline
    from lait.build.config import BuildConfig

    if in_child:
        monkeypatch.setattr(pipeline, "PLAN_IN_PROCESS_IMAGES", 0)

    data.make_work(tmp_path)
    cfg = BuildConfig(work=str(tmp_path), workers=1, progress=False, samples_per_shard=16)
    real = pipeline.plan_build

    def broken(work, cfg):
        raise ValueError("plan exploded on purpose")

    monkeypatch.setattr(pipeline, "plan_build", broken)
    with pytest.raises(RuntimeError, match="plan exploded on purpose"):
        pipeline.build(cfg)
    assert not (tmp_path / "shards").exists() or not list((tmp_path / "shards").glob("*.tar"))

    monkeypatch.setattr(pipeline, "plan_build", real)
    result = pipeline.build(cfg)
    assert result.ok and result.stats["samples"] > 0
    assert list((tmp_path / "shards").glob("*.tar"))
