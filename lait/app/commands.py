"""What every command of the `lait` CLI shares: a sub-command made from a config class, and the
exit code of a stage run."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable
from typing import Any

from lait.config import Config
from lait.stage import RunReport

NEGATIVE_NUMBER = re.compile(r"^-(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?$|^-(?:inf|infinity|nan)$", re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    """An argument parser that takes no abbreviations: `--min-sid 200` is an error, never a
    silent `--min-side 200`. Sub-command parsers are made of the same class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        # A value that starts with '-' is taken for an option unless it looks like a negative
        # number; argparse's own test knows only `-5` and `-.5`, so `--min-score -inf` failed
        # with "expected one argument". Here -inf, -nan and -1e-3 are numbers too.
        self._negative_number_matcher = NEGATIVE_NUMBER

    def error(self, message: str):  # type: ignore[override]
        """One line, exit status 2: what is wrong and where the options are listed (argparse
        would print the whole usage first)."""
        self.exit(2, f"{self.prog}: {message} (`{self.prog} --help` lists the options)\n")

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """As argparse's, but an unknown argument is reported by the sub-command it was given
        to, with the closest option it has (`--min-sid`: did you mean --min-side?)."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            parser = getattr(parsed, "_parser", None) or self
            parser.error(unknown_arguments(parser, extra))
        return parsed


def unknown_arguments(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    message = "unrecognized arguments: " + " ".join(extra)
    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    for arg in extra:
        close = difflib.get_close_matches(arg.split("=", 1)[0], options, n=1, cutoff=0.75) if arg.startswith("--") else []
        if close:
            return f"{message}; did you mean {close[0]}?"
    return message


def sub_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every sub-command parser below `parser`, nested ones included (`lait train pretrain`)."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # aliases share one parser
                out += [child, *sub_parsers(child)]
    return out


def finish_sub_commands(parser: argparse.ArgumentParser) -> None:
    """Give every sub-command (nested ones too) the global flags, and let it report the
    arguments it does not know itself (see `Parser.parse_args`)."""
    for child in sub_parsers(parser):
        add_global_flags(child, default=argparse.SUPPRESS)
        child.set_defaults(_parser=child)


def add_global_flags(parser: argparse.ArgumentParser, default: object = 0) -> None:
    """-v and -q. The top-level parser has them with their defaults; every sub-command has them
    too, defaulting to SUPPRESS so that `lait filter work/ -q` works and an absent flag there
    leaves the value given before the command alone."""
    quiet_default = False if default == 0 else default
    parser.add_argument("-v", "--verbose", action="count", default=default, help="more logging (debug)")
    parser.add_argument("-q", "--quiet", action="store_true", default=quiet_default,
                        help="warnings and errors only")


def add_config_command(sub: argparse._SubParsersAction, name: str, config_cls: type[Config],
                       run: Callable[[Any], int], *, help: str, description: str | None = None,
                       epilog: str | None = None, continues: bool = False) -> argparse.ArgumentParser:
    """A sub-command whose flags are the fields of `config_cls`; `run(config)` does the work.

    `continues`: the command is a stage of a work directory; without --config it continues with
    the settings the directory's data was last made with by it (`WORK/_configs/NAME.yaml`), as
    `lait run` does, so that rerunning one stage does not silently redo it with the defaults.
    Flags override those settings one by one; the redone partitions say why."""
    parser = sub.add_parser(name, help=help, description=description or help, epilog=epilog,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    config_cls.add_arguments(parser)

    def func(args: argparse.Namespace) -> int:
        base, note = continued_settings(name, config_cls, args) if continues else (None, "")
        cfg = config_cls.from_args(args, base)  # a refused setting is the one line printed
        if note:
            from lait.lock import say_when_held

            say_when_held(note)  # once the run holds WORK: a busy or read-only WORK is one line
        return run(cfg)

    parser.set_defaults(func=func)
    return parser


def continued_settings(name: str, config_cls: type[Config], args: argparse.Namespace
                       ) -> tuple[dict[str, Any], str]:
    """The recorded settings `lait NAME WORK` continues with (see `add_config_command`) and the
    line that says so (printed once they are found valid); none when --config is given or the
    directory has none."""
    from lait.app.steps import recorded_settings

    work = getattr(args, "work", None)
    if getattr(args, "config", None) or not work:
        return {}, ""
    try:
        data, path = recorded_settings(work, name, config_cls)
    except (ImportError, OSError):  # no s3fs, no bucket: the stage says so when it opens WORK
        return {}, ""
    if path is None:
        return {}, ""
    given = sorted(k for k in data if getattr(args, k, None) is not None)
    changed = f"; given here: {', '.join('--' + k.replace('_', '-') for k in given)}" if given else ""
    return data, (f"lait {name}: continuing with the settings {work} was last made with ({path}){changed}; "
                  "--config FILE starts from that file and the defaults instead")


def add_unavailable_command(sub: argparse._SubParsersAction, name: str, missing: ImportError, *,
                            help: str) -> argparse.ArgumentParser:
    """A sub-command whose packages are not installed here (a GPU image without the crawler's,
    say): listed, and when run or asked for --help, one line naming what is missing; the other
    commands still work."""
    what = getattr(missing, "name", None) or str(missing)
    note = f"unavailable here: it needs the package {what!r}, which is not installed (pip install lait)"
    parser = sub.add_parser(name, help=f"{help} [{note}]", description=f"{help}\n\n{note}",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def run(_args: Any) -> int:
        print(f"lait {name}: {note}", file=sys.stderr)
        return 2

    parser.set_defaults(func=run)
    return parser


def report_exit_code(report: RunReport) -> int:
    print(report.summary(), file=sys.stderr)
    return 0 if report.ok else 1
