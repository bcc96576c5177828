"""One config dataclass per command: defaults in code, a YAML file over them, CLI flags over that.

    @dataclass
    class FilterConfig(Config):
        work: str = field(default="", metadata={"help": "work directory", "positional": True})
        min_side: int = field(default=300, metadata={"help": "minimum image side in pixels"})

`FilterConfig.add_arguments(parser)` turns the fields into flags (`--min-side`), and
`FilterConfig.from_args(args)` resolves defaults < `--config FILE.yaml` < flags. The resolved
config is written into the work directory with `to_yaml()`, so every output says how it was made.

A config may nest: a field whose type is a dataclass (or a list of them) is read from a mapping
(a list of mappings) with the same checks, and a mistake names its dotted path
(`stages.0.optim.lr: expected float, got 'fast'`). Nested settings have no flags of their own;
a config that sets `dotted_overrides` gets `--set a.b.0.c=VALUE` (VALUE read as YAML) for them.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import math
import types
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
    """(type, optional) for `int`, `int | None`, `list[str]`, `str | list[str] | None`, ..."""
    args = get_args(tp)
    if get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = tuple(a for a in args if a is not type(None))
        return (rest[0] if len(rest) == 1 else typing.Union[rest]), True
    return tp, False


def _is_config_class(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _nested(tp: Any) -> bool:
    """Whether a field holds settings of its own (a dataclass, or a list of them): no flag."""
    base, _ = _base_type(tp)
    if get_origin(base) in (list, tuple):
        return any(_is_config_class(a) for a in get_args(base))
    return _is_config_class(base)


def _join(path: str, key: str | int) -> str:
    return f"{path}.{key}" if path else str(key)


def _error(where: str, path: str, message: str) -> ConfigError:
    """`where: path: message`, leaving out what is empty, on one line."""
    return ConfigError(": ".join(p for p in (where, path, message) if p))


def _type_name(tp: Any) -> str:
    return str(tp).replace("typing.", "") if get_origin(tp) else getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str, path: str) -> Any:
    """`value` as type `tp`, or a ConfigError naming `path` (the setting's dotted path)."""
    base, optional = _base_type(tp)
    if value is None:
        if optional:
            return None
        if _is_config_class(base):  # an empty YAML section (`data:`) means its defaults
            return base()
        raise _error(where, path, "null is not allowed")
    if _is_config_class(base):
        if isinstance(value, base):
            return value
        return build(base, value, where=where, path=path)
    origin = get_origin(base)
    if origin in (typing.Union, types.UnionType):
        for alternative in get_args(base):
            try:
                return _coerce(value, alternative, where, path)
            except ConfigError:
                continue
        names = " or ".join(_type_name(a) for a in get_args(base))
        raise _error(where, path, f"expected {names}, got {value!r}")
    if origin in (list, tuple):
        (item,) = get_args(base)[:1] or (str,)
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise _error(where, path, f"expected a list, got {value!r}")
        return [_coerce(v, item, where, _join(path, i)) for i, v in enumerate(value)]
    if origin is dict or base is dict:
        if not isinstance(value, dict):
            raise _error(where, path, f"expected a mapping, got {value!r}")
        return dict(value)
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "false", "no", "0"):
            return value.lower() in ("true", "yes", "1")
        raise _error(where, path, f"expected true or false, got {value!r}")
    if base in (int, float, str):
        if base is str and not isinstance(value, str):
            raise _error(where, path, f"expected a string, got {value!r}")
        try:
            out = base(value)
        except (TypeError, ValueError, OverflowError):  # OverflowError: int(.inf)
            raise _error(where, path, f"expected {base.__name__}, got {value!r}") from None
        if base is int and isinstance(value, float) and value != out:
            raise _error(where, path, f"expected an integer, got {value!r}")
        if base is float and not math.isfinite(out):
            # nan passes every comparison a rule makes as False, inf every bound: a threshold of
            # either would empty or keep everything without a word.
            raise _error(where, path, f"expected a finite number, got {value!r}")
        return out
    return value


def build(cls: type[C], data: Any, *, where: str = "config", path: str = "") -> C:
    """Dataclass `cls` from a mapping of its settings, nested ones included; every value is
    checked and converted, and an unknown or ill-typed setting is a ConfigError naming it."""
    if not isinstance(data, dict):
        raise _error(where, path, f"expected a mapping of settings, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}
    unknown = set(data) - set(known)
    moved_to = getattr(cls, "moved", {})  # nested settings are plain dataclasses, without it
    moved = {u: moved_to[u] for u in unknown if u in moved_to}
    if moved:
        raise _error(where, path, "; ".join(f"{u} is a setting of `{to}` now" for u, to in sorted(moved.items()))
                     + f" ({cls.__name__}.moved)")
    if unknown:
        guesses = [f"{u}: did you mean {close[0]}" for u in sorted(map(str, unknown))
                   for close in [difflib.get_close_matches(u, list(known), n=1, cutoff=0.75)] if close]
        hint = f" ({'; '.join(guesses)}?)" if guesses else ""
        raise _error(where, path, f"unknown settings {sorted(map(str, unknown))}; known: {sorted(known)}{hint}")
    return cls(**{k: _coerce(v, known[k], where, _join(path, k)) for k, v in data.items()})


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML parser error on one line: what is wrong and where."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark else problem


# A config file holds settings, not data: long lists (seeds, URLs) go in a file a setting names.
# PyYAML is slow and large on big files (a 17.5 MB file of 2.5 M list items: 53 s and 1.5 GB,
# silently; 1 MiB of list items: 3 s), so a bigger file is refused before it is parsed.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_TEXT = "1 MiB"


def _config_text(path: str | Path) -> str:
    """The text of a config file of at most MAX_CONFIG_BYTES, read as UTF-8; a pipe or device is
    read only that far."""
    with open(path, "rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_TEXT}, the most a config file may be: "
                          "settings only; put long lists (seeds, URLs) in a file that a setting names")
    return raw.decode("utf-8")


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping, or a ConfigError that says what is wrong; a file
    over MAX_CONFIG_BYTES is refused unread."""
    try:
        data = yaml.safe_load(_config_text(path)) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    return data


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one `--set a.b.0.c=VALUE` to nested settings in place; VALUE is read as YAML
    (`5e-5`, `true`, `[a, b]`, `{lr: 1.0e-3}`), a number in the path indexes a list."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. --set stages.0.steps=100")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: the value is not valid YAML: {_yaml_problem(exc)}") from None
    parts = key.split(".")
    node: Any = data
    for depth, part in enumerate(parts):
        here, last = ".".join(parts[: depth + 1]), depth == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"--set {key}: {here[: -len(part) - 1]} has {len(node)} item(s), "
                                  f"so no item {part!r}")
            index: Any = int(part)
        elif isinstance(node, dict):
            index = part
            if not last and node.get(part) is None:
                if parts[depth + 1].isdigit():
                    raise ConfigError(f"--set {key}: {here} is not set, so it has no item "
                                      f"{parts[depth + 1]}; set the whole list: --set {here}=[...]")
                node[part] = {}
        else:
            raise ConfigError(f"--set {key}: {here[: -len(part) - 1]} is {node!r}, which has no settings")
        if last:
            node[index] = value
        else:
            node = node[index]


def _choice_errors(obj: Any, path: str) -> list[str]:
    """`path: expected one of ...` for every value outside its field's `choices`, nested too."""
    out = []
    for f in dataclasses.fields(obj):
        value, here = getattr(obj, f.name), _join(path, f.name)
        choices = f.metadata.get("choices")
        if choices and value is not None and value not in choices:
            out.append(f"{here}: expected one of {list(choices)}, got {value!r}")
        if dataclasses.is_dataclass(value):
            out += _choice_errors(value, here)
        elif isinstance(value, list):
            out += [e for i, v in enumerate(value) if dataclasses.is_dataclass(v)
                    for e in _choice_errors(v, _join(here, i))]
    return out


class _Moved(argparse.Action):
    """The flag of a setting that moved to another command (`Config.moved`): an error naming it."""

    def __init__(self, *args: Any, to: str, **kwargs: Any):
        self.to = to
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None) -> None:
        parser.error(f"{option_string} is a setting of `lait {self.to}` now")


@dataclasses.dataclass
class Config:
    """Base of every command's config dataclass."""

    # The YAML section a multi-command file (`lait run --config pipeline.yaml`) uses for it.
    section: ClassVar[str | None] = None
    # Whether the command takes `--set a.b.0.c=VALUE` (for nested settings, which have no flags).
    dotted_overrides: ClassVar[bool] = False
    # Settings that moved to another command's section: their name -> that section, said in
    # the error a file that still sets them here gets.
    moved: ClassVar[dict[str, str]] = {}

    @classmethod
    def _fields(cls) -> list[tuple[dataclasses.Field, Any]]:
        hints = typing.get_type_hints(cls)
        return [(f, hints[f.name]) for f in dataclasses.fields(cls) if f.init]

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, with_config_file: bool = True) -> None:
        """Add one flag per field (and `--config`). Flags default to None so unset ones are known."""
        if with_config_file:
            parser.add_argument("--config", metavar="YAML", default=None,
                                help=f"YAML file with any of these settings, at most {MAX_CONFIG_TEXT} "
                                     "(flags override it)")
        if cls.dotted_overrides:
            parser.add_argument("--set", dest="set_overrides", action="append", default=[], metavar="KEY=VALUE",
                                help="set any setting, nested ones too, by its dotted path; the value is "
                                     "read as YAML; repeatable, applied last: --set stages.0.optim.lr=5e-5")
        for f, tp in cls._fields():
            if _nested(tp):
                continue
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
        for name, to in cls.moved.items():  # not listed in --help; given, they say where they went
            parser.add_argument(_flag(name), nargs="?", action=_Moved, help=argparse.SUPPRESS, to=to)

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any] | None, *, where: str = "config") -> C:
        return build(cls, dict(data or {}), where=where)

    @classmethod
    def load_yaml(cls, path: str | Path) -> dict[str, Any]:
        data = read_yaml_mapping(path)
        if cls.section and isinstance(data.get(cls.section), dict):
            data = data[cls.section]
        return data

    @classmethod
    def from_args(cls: type[C], args: argparse.Namespace, base: dict[str, Any] | None = None) -> C:
        """Defaults, then `base` (settings a command continues with), then the `--config` YAML
        file, then the flags, then the `--set` overrides."""
        data: dict[str, Any] = dict(base or {})
        path = getattr(args, "config", None)
        if path:
            data.update(cls.load_yaml(path))
        for f, _ in cls._fields():
            value = getattr(args, f.name, None)
            if value is not None:
                data[f.name] = value
        for assignment in getattr(args, "set_overrides", None) or []:
            apply_override(data, assignment)
        cfg = cls.from_dict(data, where=str(path or "command line"))
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Override to check values together; raise ConfigError with a clear message."""

    def check_choices(self) -> None:
        """Raise a ConfigError for the first value, nested ones included, outside its `choices`."""
        errors = _choice_errors(self, "")
        if errors:
            raise ConfigError(errors[0])

    def output_settings(self) -> dict[str, Any]:
        """The settings that can change what the command writes (not those marked `run`): what
        a partition's fingerprint records."""
        keep = {f.name for f, _ in self._fields() if not f.metadata.get("run")}
        return {k: v for k, v in self.to_dict().items() if k in keep}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def write_resolved(self, out_dir: str | Path, name: str = "config.yaml") -> Path:
        """Write the resolved config as `out_dir/name`, so the output says how it was made."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / name
        path.write_text(self.to_yaml())
        return path

    def replace(self: C, **changes: Any) -> C:
        return dataclasses.replace(self, **changes)


def setting(default: Any = dataclasses.MISSING, help: str = "", *, run: bool = False, **metadata: Any) -> Any:
    """A config field with its help text: `min_side: int = setting(300, "minimum side in px")`.
    A mutable default (a list, a nested config) is copied for every instance.

    `run=True` marks a setting that says how a command runs (workers, batch sizes, progress
    bars) and never what it writes: it is left out of the fingerprint of a partition, so
    changing it redoes nothing."""
    md = {"help": help, "run": run, **metadata}
    if isinstance(default, (list, dict, set)) or (dataclasses.is_dataclass(default) and not isinstance(default, type)):
        value = default
        return dataclasses.field(default_factory=lambda: copy.deepcopy(value), metadata=md)
    return dataclasses.field(default=default, metadata=md)


@dataclasses.dataclass
class StageConfig(Config):
    """Settings every partitioned stage command shares."""

    work: str = setting("", "work directory (holds pages/, images/, ... as Parquet parts)", positional=True,
                        run=True)
    executor: str = setting("local", "where partitions run: a local process pool, or a Ray cluster",
                            choices=["local", "ray"], run=True)
    ray_address: str | None = setting(None, "Ray cluster address for --executor ray (default: start a local one)",
                                      run=True)
    workers: int = setting(0, "worker processes (0: one per CPU core)", run=True)
    retries: int = setting(2, "times a failing partition is retried before it is reported", run=True)
    progress: bool = setting(True, "show a progress bar on a terminal", run=True)
    force: bool = setting(False, "redo every partition, even those whose settings and input are unchanged",
                          run=True)

    def validate(self) -> None:
        if not self.work:
            raise ConfigError("a work directory is required")
        if self.workers < 0 or self.retries < 0:
            raise ConfigError("workers and retries must be >= 0")
