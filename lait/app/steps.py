"""The stages `lait run` chains (filter, clean, score, build), with their config classes and
the pipeline YAML that holds a section of settings per stage."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass

from lait.config import Config, ConfigError, read_yaml_mapping


@dataclass(frozen=True)
class Step:
    """One stage of `lait run`: its YAML section and its config class."""

    name: str
    module: str
    config: str

    def config_class(self) -> type[Config]:
        try:
            return getattr(importlib.import_module(self.module), self.config)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"stage {self.name!r} is not available ({self.module}.{self.config}: {exc})") from None


STEPS = (
    Step("filter", "lait.filters.config", "FilterConfig"),
    Step("clean", "lait.filters.config", "CleanConfig"),
    Step("score", "lait.scoring.config", "ScoreConfig"),
    Step("build", "lait.build.config", "BuildConfig"),
)
STEP_NAMES = [s.name for s in STEPS]


def recorded_settings(work: str, name: str, cls: type[Config] | None = None) -> tuple[dict, str | None]:
    """The settings command `name` (a stage) last completed with in `work`
    (`WORK/_configs/NAME.yaml`), with `cls` those that change what it writes only (not workers,
    progress, force), and the file they come from; ({}, None) when it has none."""
    import yaml

    from lait import storage
    from lait.workdir import WorkDir

    try:
        path = WorkDir(work).root / "_configs" / f"{name}.yaml"
    except ValueError:
        return {}, None
    if not storage.exists(path):
        return {}, None
    try:
        data = yaml.safe_load(storage.read_text(path)) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc}); give --config") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings; give --config")
    written = None if cls is None else {f.name for f, _ in cls._fields() if not f.metadata.get("run")}
    return {k: v for k, v in data.items() if (written is None or k in written) and k != "work"}, str(path)


def recorded_sections(work: str, skip: Iterable[str] = ()) -> tuple[dict[str, dict], list[str]]:
    """The settings each stage of `work` last completed with (`recorded_settings`), as sections
    of a pipeline YAML, for every stage not in `skip`; and the names of the files read."""
    sections: dict[str, dict] = {}
    used: list[str] = []
    for step in STEPS:
        if step.name in skip:
            continue
        data, path = recorded_settings(work, step.name, step.config_class())
        if path is not None:
            sections[step.name] = data
            used.append(f"{step.name}.yaml")
    return sections, used


def pipeline_sections(work: str, path: str) -> tuple[dict[str, dict], list[str]]:
    """The settings `lait run WORK --config PATH` runs each stage with, as `lait STAGE WORK`
    would: a stage the file has a section for takes that section over the defaults (as `lait
    STAGE --config`), one it has none for continues with the settings WORK was last made with
    (as `lait STAGE` without --config), so a file about stage 5 does not redo stage 2 with the
    defaults. Returns the sections and the recorded files continued with."""
    given = load_pipeline_yaml(path)
    recorded, used = recorded_sections(work, skip=given)
    return {**recorded, **given}, used


def load_pipeline_yaml(path: str | None) -> dict[str, dict]:
    """The sections of a pipeline YAML (an empty mapping without a file)."""
    if not path:
        return {}
    data = read_yaml_mapping(path)
    unknown = set(data) - set(STEP_NAMES) - {"crawl"}
    if unknown:
        raise ConfigError(f"{path}: unknown sections {sorted(unknown)}; known: {STEP_NAMES}")
    for k, v in data.items():
        if v is not None and not isinstance(v, dict):
            raise ConfigError(f"{path}: section {k!r} must be a mapping of settings")
    return {k: dict(v or {}) for k, v in data.items()}
