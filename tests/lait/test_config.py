import argparse
import subprocess
import sys
from dataclasses import dataclass

import pytest
import yaml

from lait.config import Config, ConfigError, StageConfig, apply_override, setting


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


# ---- nested settings, dotted overrides ----------------------------------------------------------

@dataclass
class Optim(Config):
    lr: float = setting(1e-4, "learning rate")
    schedule: str = setting("linear", "decay", choices=["linear", "cosine"])
    betas: list[float] = setting([0.9, 0.999], "betas")


@dataclass
class Step(Config):
    name: str = setting("step", "name")
    shards: str | list[str] | None = setting(None, "a dir or a list of tars")
    optim: Optim = setting(Optim(), "optimiser")


@dataclass
class Nested(Config):
    dotted_overrides = True
    seed: int = setting(0, "seed")
    optim: Optim = setting(Optim(), "default optimiser")
    steps: list[Step] = setting([], "steps in order")
    fallback: Optim | None = setting(None, "optional nested")


def nested(argv):
    parser = argparse.ArgumentParser()
    Nested.add_arguments(parser)
    return Nested.from_args(parser.parse_args(argv))


def test_nested_settings_and_lists_of_them_are_built_and_coerced():
    cfg = Nested.from_dict({"optim": {"lr": "1e-3"}, "steps": [{"name": "a", "shards": "d/"},
                                                             {"shards": ["x.tar"], "optim": {"lr": 2}}]})
    assert cfg.optim == Optim(lr=1e-3) and cfg.seed == 0
    assert cfg.steps == [Step("a", "d/"), Step("step", ["x.tar"], Optim(lr=2.0))]
    assert isinstance(cfg.steps[1].optim.lr, float)
    assert Nested.from_dict({"optim": None}).optim == Optim()  # an empty YAML section: its defaults
    assert Nested().optim is not Nested().optim  # defaults are copied, never shared
    again = Nested.from_dict(yaml.safe_load(cfg.to_yaml()))
    assert again == cfg


@pytest.mark.parametrize("data, message", [
    ({"steps": [{}, {"optim": {"lr": "fast"}}]}, r"^config: steps\.1\.optim\.lr: expected float, got 'fast'$"),
    ({"optim": {"lrr": 1}}, r"^config: optim: unknown settings \['lrr'\]; known: \['betas', 'lr', 'schedule'\] \(lrr: did you mean lr\?\)$"),
    ({"optim": {"betas": [0.9, "x"]}}, r"^config: optim\.betas\.1: expected float, got 'x'$"),
    ({"steps": {"name": "a"}}, r"^config: steps: expected a list"),
    ({"steps": ["a"]}, r"^config: steps\.0: expected a mapping of settings, got 'a'$"),
    ({"steps": [{"shards": 3}]}, r"^config: steps\.0\.shards: expected str or list\[str\], got 3$"),
    ({"fallback": {"lr": []}}, r"^config: fallback\.lr: expected float"),
])
def test_nested_mistakes_name_their_dotted_path_on_one_line(data, message):
    with pytest.raises(ConfigError, match=message):
        Nested.from_dict(data)


def test_choices_are_checked_at_every_depth_on_request():
    cfg = Nested.from_dict({"steps": [{"optim": {"schedule": "cosin"}}]})
    with pytest.raises(ConfigError, match=r"^steps\.0\.optim\.schedule: expected one of \['linear', 'cosine'\], got 'cosin'$"):
        cfg.check_choices()
    Nested.from_dict({"steps": [{"optim": {"schedule": "cosine"}}]}).check_choices()


def test_dotted_overrides_reach_nested_settings_and_list_items(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text(yaml.safe_dump({"seed": 1, "steps": [{"name": "a", "shards": "d/"}]}))
    cfg = nested(["--config", str(f), "--seed", "2", "--set", "steps.0.optim.lr=5e-5",
                  "--set", "optim={lr: 0.5, betas: [0.8, 0.9]}", "--set", "steps.0.shards=[a.tar, b.tar]",
                  "--set", "fallback.schedule=cosine"])
    assert cfg.seed == 2 and cfg.steps[0].optim.lr == 5e-5 and cfg.steps[0].shards == ["a.tar", "b.tar"]
    assert cfg.optim == Optim(0.5, "linear", [0.8, 0.9]) and cfg.fallback == Optim(schedule="cosine")
    assert nested(["--set", "seed=3", "--seed", "4"]).seed == 3  # --set comes last
    assert nested(["--set", "steps=[{name: x}, {name: y}]"]).steps == [Step("x"), Step("y")]


@pytest.mark.parametrize("assignment, message", [
    ("seed", r"^--set 'seed': expected KEY=VALUE"),
    ("steps.0.name=x", r"^--set steps\.0\.name: steps is not set, so it has no item 0; set the whole list"),
    ("seed.x=1", r"^--set seed\.x: seed is 1, which has no settings$"),
    ("optim.lr=[1", r"^--set optim\.lr: the value is not valid YAML: .*\(line 1, column 3\)$"),
])
def test_bad_dotted_overrides_are_named(assignment, message):
    data = {"seed": 1}
    with pytest.raises(ConfigError, match=message):
        apply_override(data, assignment)
    data = {"steps": [{"name": "a"}]}
    with pytest.raises(ConfigError, match=r"^--set steps\.1\.name: steps has 1 item\(s\), so no item '1'$"):
        apply_override(data, "steps.1.name=b")


def test_only_configs_that_ask_for_it_take_set_and_nested_settings_have_no_flags():
    parser = argparse.ArgumentParser()
    DemoFilterConfig.add_arguments(parser)
    assert "--set" not in parser.format_help()
    parser = argparse.ArgumentParser()
    Nested.add_arguments(parser)
    text = parser.format_help()
    assert "--set KEY=VALUE" in text and "--seed" in text and "--optim" not in text and "--steps" not in text


def test_bad_yaml_is_one_line_and_resolved_config_is_written(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [\n  - name: a\n")
    with pytest.raises(ConfigError) as info:
        nested(["--config", str(bad)])
    assert "not valid YAML" in str(info.value) and "line" in str(info.value) and "\n" not in str(info.value)
    cfg = nested(["--set", "steps=[{name: x, optim: {lr: 0.1}}]"])
    path = cfg.write_resolved(tmp_path / "out")
    assert path == tmp_path / "out" / "config.yaml"
    assert Nested.from_dict(yaml.safe_load(path.read_text())) == cfg
