import argparse
import subprocess
import sys
from dataclasses import dataclass

import pytest
import yaml

from lait.config import ConfigError, StageConfig, setting


@dataclass
class DemoFilterConfig(StageConfig):
    section = "filter"
    min_side: int = setting(300, "minimum image side in px")
    max_aspect: float = setting(3.0, "maximum aspect ratio")
    formats: list[str] = setting(["JPEG", "PNG"], "allowed formats")
    animated: bool = setting(False, "keep the first frame of animated images")
    classifier: str | None = setting(None, "uninformative-image classifier")


def parse(argv):
    parser = argparse.ArgumentParser()
    DemoFilterConfig.add_arguments(parser)
    return DemoFilterConfig.from_args(parser.parse_args(argv))


def test_defaults_then_yaml_then_flags(tmp_path):
    cfg = parse(["work/"])
    assert (cfg.work, cfg.min_side, cfg.formats, cfg.animated) == ("work/", 300, ["JPEG", "PNG"], False)
    f = tmp_path / "pipeline.yaml"
    f.write_text(yaml.safe_dump({"filter": {"min_side": 200, "animated": True}, "score": {"model": "x"}}))
    cfg = parse(["work/", "--config", str(f)])
    assert (cfg.min_side, cfg.animated, cfg.max_aspect) == (200, True, 3.0)
    cfg = parse(["work/", "--config", str(f), "--min-side", "256", "--no-animated", "--formats", "JPEG"])
    assert (cfg.min_side, cfg.animated, cfg.formats) == (256, False, ["JPEG"])


def test_resolved_config_round_trips_through_yaml():
    cfg = parse(["w", "--max-aspect", "2.5"])
    again = DemoFilterConfig.from_dict(yaml.safe_load(cfg.to_yaml()))
    assert again == cfg


@pytest.mark.parametrize("data, message", [
    ({"min_sid": 3}, "unknown settings"),
    ({"min_side": "big"}, "expected int"),
    ({"min_side": 2.5}, "expected an integer"),
    ({"animated": "maybe"}, "true or false"),
    ({"work": None}, "null is not allowed"),
])
def test_bad_settings_are_named(data, message):
    with pytest.raises(ConfigError, match=message):
        DemoFilterConfig.from_dict(data)


def test_missing_work_dir_and_bad_file(tmp_path):
    with pytest.raises(ConfigError, match="work directory is required"):
        parse([])
    with pytest.raises(ConfigError, match="not found"):
        parse(["w", "--config", str(tmp_path / "nope.yaml")])
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        parse(["w", "--config", str(bad)])


def test_lait_help_lists_the_pipeline():
    out = subprocess.run([sys.executable, "-m", "lait", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert "serve-site" in out.stdout and "lait demo --out demo/" in out.stdout
    assert subprocess.run([sys.executable, "-m", "lait"], capture_output=True, timeout=60).returncode == 2
