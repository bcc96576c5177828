"""One config dataclass per command: defaults in code, a YAML file over them, CLI flags over that.

    @dataclass
    class FilterConfig(Config):
        work: str = field(default="", metadata={"help": "work directory", "positional": True})
        min_side: int = field(default=300, metadata={"help": "minimum image side in pixels"})

`FilterConfig.add_arguments(parser)` turns the fields into flags (`--min-side`), and
`FilterConfig.from_args(args)` resolves defaults < `--config FILE.yaml` < flags. The resolved
config is written into the work directory with `to_yaml()`, so every output says how it was made.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from pathlib import Path
from typing import Any, ClassVar, TypeVar, get_args, get_origin

import yaml

C = TypeVar("C", bound="Config")


class ConfigError(ValueError):
    """A config file or flag that does not fit the command's config."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(type, optional) for `int`, `int | None`, `list[str]`, ..."""
    args = get_args(tp)
    if get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return tp, False


def _coerce(value: Any, tp: Any, name: str) -> Any:
    base, optional = _base_type(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{name}: null is not allowed")
    origin = get_origin(base)
    if origin in (list, tuple):
        (item,) = get_args(base)[:1] or (str,)
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return [_coerce(v, item, name) for v in value]
    if origin is dict or base is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a mapping, got {value!r}")
        return dict(value)
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "false", "no", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if base in (int, float, str):
        if base is str and not isinstance(value, str):
            raise ConfigError(f"{name}: expected a string, got {value!r}")
        try:
            out = base(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected {base.__name__}, got {value!r}") from None
        if base is int and isinstance(value, float) and value != out:
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        return out
    return value


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping, or a ConfigError that says what is wrong."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    return data


@dataclasses.dataclass
class Config:
    """Base of every command's config dataclass."""

    # The YAML section a multi-command file (`lait run --config pipeline.yaml`) uses for it.
    section: ClassVar[str | None] = None

    @classmethod
    def _fields(cls) -> list[tuple[dataclasses.Field, Any]]:
        hints = typing.get_type_hints(cls)
        return [(f, hints[f.name]) for f in dataclasses.fields(cls) if f.init]

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, with_config_file: bool = True) -> None:
        """Add one flag per field (and `--config`). Flags default to None so unset ones are known."""
        if with_config_file:
            parser.add_argument("--config", metavar="YAML", default=None,
                                help="YAML file with any of these settings (flags override it)")
        for f, tp in cls._fields():
            base, _ = _base_type(tp)
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            help_ = f.metadata.get("help", "")
            if default not in (None, "", []) and base is not bool:
                help_ += f" (default: {default})"
            kwargs: dict[str, Any] = {"help": help_, "default": None}
            if f.metadata.get("choices"):
                kwargs["choices"] = f.metadata["choices"]
            if f.metadata.get("positional"):
                nargs = f.metadata.get("nargs", "?")
                parser.add_argument(f.name, metavar=f.name.upper(), nargs=nargs, **kwargs)
                continue
            if base is bool:
                kwargs["help"] += f" (default: {'on' if default else 'off'})"
                parser.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, **kwargs)
            elif get_origin(base) in (list, tuple):
                # `--seeds a b` and `--seeds a --seeds b` both give [a, b] (curl-like repeats).
                parser.add_argument(_flag(f.name), nargs="+", action="extend",
                                    metavar=f.metadata.get("metavar", f.name.upper()), **kwargs)
            elif base in (int, float):
                parser.add_argument(_flag(f.name), type=base, metavar="N" if base is int else "X", **kwargs)
            else:
                parser.add_argument(_flag(f.name), metavar=f.metadata.get("metavar", f.name.upper()), **kwargs)

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any] | None, *, where: str = "config") -> C:
        data = dict(data or {})
        known = {f.name: tp for f, tp in cls._fields()}
        unknown = set(data) - set(known)
        if unknown:
            raise ConfigError(f"{where}: unknown settings {sorted(unknown)}; known: {sorted(known)}")
        return cls(**{k: _coerce(v, known[k], f"{where}: {k}") for k, v in data.items()})

    @classmethod
    def load_yaml(cls, path: str | Path) -> dict[str, Any]:
        data = read_yaml_mapping(path)
        if cls.section and isinstance(data.get(cls.section), dict):
            data = data[cls.section]
        return data

    @classmethod
    def from_args(cls: type[C], args: argparse.Namespace) -> C:
        """Defaults, then the `--config` YAML file, then the flags given on the command line."""
        data: dict[str, Any] = {}
        path = getattr(args, "config", None)
        if path:
            data.update(cls.load_yaml(path))
        for f, _ in cls._fields():
            value = getattr(args, f.name, None)
            if value is not None:
                data[f.name] = value
        cfg = cls.from_dict(data, where=str(path or "command line"))
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Override to check values together; raise ConfigError with a clear message."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def replace(self: C, **changes: Any) -> C:
        return dataclasses.replace(self, **changes)


def setting(default: Any = dataclasses.MISSING, help: str = "", **metadata: Any) -> Any:
    """A config field with its help text: `min_side: int = setting(300, "minimum side in px")`."""
    md = {"help": help, **metadata}
    if isinstance(default, (list, dict, set)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata=md)
    return dataclasses.field(default=default, metadata=md)


@dataclasses.dataclass
class StageConfig(Config):
    """Settings every partitioned stage command shares."""

    work: str = setting("", "work directory (holds pages/, images/, ... as Parquet parts)", positional=True)
    executor: str = setting("local", "where partitions run: a local process pool, or a Ray cluster",
                            choices=["local", "ray"])
    ray_address: str | None = setting(None, "Ray cluster address for --executor ray (default: start a local one)")
    workers: int = setting(0, "worker processes (0: one per CPU core)")
    retries: int = setting(2, "times a failing partition is retried before it is reported")
    progress: bool = setting(True, "show a progress bar on a terminal")

    def validate(self) -> None:
        if not self.work:
            raise ConfigError("a work directory is required")
        if self.workers < 0 or self.retries < 0:
            raise ConfigError("workers and retries must be >= 0")
