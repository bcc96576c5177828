"""The `lait` command line as a whole: no abbreviations anywhere, global flags on either side of
the command, and argument mistakes in one line."""

from __future__ import annotations

import argparse
import re

import pytest

from lait.app.cli import build_parser, main
from lait.app.commands import sub_parsers


def all_parsers() -> list[argparse.ArgumentParser]:
    parser = build_parser()
    return [parser, *sub_parsers(parser)]


def command_of(parser: argparse.ArgumentParser) -> list[str]:
    return parser.prog.split()[1:]  # "lait train pretrain" -> ["train", "pretrain"]


def test_every_parser_refuses_abbreviations():
    parsers = all_parsers()
    assert len(parsers) > 12  # the commands and train's sub-commands
    assert all(not p.allow_abbrev for p in parsers), [p.prog for p in parsers if p.allow_abbrev]


@pytest.mark.parametrize("prog", [p.prog for p in all_parsers()[1:] if not p._subparsers])
def test_an_abbreviated_flag_is_an_error_in_every_command(prog, capsys):
    parser = next(p for p in all_parsers() if p.prog == prog)
    flags = [o for a in parser._actions for o in a.option_strings
             if o.startswith("--") and len(o) > 6 and o not in ("--help", "--verbose", "--quiet")]
    if not flags:
        pytest.skip(f"{prog} has no long flag to abbreviate")
    flag = flags[0]
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*command_of(parser), flag[:-2], "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"unrecognized arguments: {flag[:-2]}" in err, err
    assert err.startswith(f"{prog}: "), err


@pytest.mark.parametrize("argv, quiet, verbose", [
    (["stats", "w"], False, 0),
    (["-q", "stats", "w"], True, 0),
    (["stats", "w", "-q"], True, 0),
    (["stats", "-q", "w"], True, 0),
    (["stats", "w", "--quiet"], True, 0),
    (["-v", "stats", "w"], False, 1),
    (["stats", "w", "-vv"], False, 2),
    (["train", "pretrain", "-q"], True, 0),
    (["train", "-q", "pretrain"], True, 0),
])
def test_global_flags_go_before_or_after_the_command(argv, quiet, verbose):
    args = build_parser().parse_args(argv)
    assert (args.quiet, args.verbose) == (quiet, verbose)


@pytest.mark.parametrize("argv, verbosity", [(["stats", "{w}", "-q"], -1), (["stats", "{w}"], 0),
                                             (["stats", "{w}", "-v"], 1), (["-q", "stats", "{w}"], -1)])
def test_the_command_logs_at_the_level_the_flags_ask_wherever_they_stand(argv, verbosity, tmp_path,
                                                                         monkeypatch, capsys):
    import lait.app.cli as cli
    from lait.workdir import WorkDir

    WorkDir(tmp_path / "work").init()
    seen = []
    monkeypatch.setattr(cli, "setup_logging", seen.append)
    assert main([a.format(w=tmp_path / "work") for a in argv]) == 0
    assert seen == [verbosity]


@pytest.mark.parametrize("verbosity,shown", [
    (0, {"lait-info", "lib-warning"}),
    (-1, {"lib-warning"}),
    (1, {"lait-info", "lib-info", "lib-debug", "lib-warning"}),
])
def test_only_lait_logs_info_unless_verbose(capsys, verbosity, shown):
    # A library that logs at INFO on a fresh machine (matplotlib's first font cache, in the
    # demo's report) put a third-party line among the stage summaries.
    import logging

    from lait.log import setup_logging

    try:
        setup_logging(verbosity)
        logging.getLogger("lait.app.run").info("lait-info")
        for lib in ("matplotlib.font_manager", "some_library"):
            logging.getLogger(lib).info("lib-info")
            logging.getLogger(lib).debug("lib-debug")
            logging.getLogger(lib).warning("lib-warning")
    finally:
        setup_logging(0)
    lines = capsys.readouterr().err.splitlines()
    assert {line.rsplit(": ", 1)[-1] for line in lines} == shown
    if verbosity == 0:
        assert sum("lib-warning" in line for line in lines) == 2


def test_an_unknown_command_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["flter", "w"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'flter'" in err


def test_demo_help_speaks_to_a_user_not_of_internal_modules():
    (demo,) = [p for p in all_parsers() if command_of(p) == ["demo"]]
    text = demo.format_help()
    assert "report.html" in text and "offline" in text
    assert not re.findall(r"\blait\.\w+", text), re.findall(r"\blait\.\w+", text)


@pytest.mark.parametrize("value,expected", [("-inf", float("-inf")), ("-Infinity", float("-inf")), ("-0.5", -0.5),
                                            ("-1e-3", -0.001), ("-5", -5.0), (".5", 0.5)])
def test_a_negative_number_is_a_value_not_a_flag(value, expected):
    """Issue 52: `--min-score -inf` was read as a flag ("expected one argument")."""
    assert build_parser().parse_args(["build", "work", "--min-score", value]).min_score == expected


def test_a_flag_after_an_option_is_still_a_flag(capsys):
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["build", "work", "--min-score", "-x"])
    assert stop.value.code == 2 and "--min-score: expected one argument" in capsys.readouterr().err
