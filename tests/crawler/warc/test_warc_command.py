"""`lait ingest-warc` through its parser: config, summary, exit codes."""

from __future__ import annotations

import argparse

import pytest
import yaml

from lait.app import ingest as warc_command
from lait.config import ConfigError
from lait.workdir import WorkDir


def run_cli(argv: list[str], fetch: bool = False) -> int:
    """`lait ingest-warc ARGV`; the archives only unless `fetch` (their ex.test images do not
    resolve: test_warc_fetch.py fetches from local mirrors)."""
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    warc_command.register(sub)
    args = p.parse_args(["ingest-warc", *argv, *([] if fetch else ["--no-fetch-images"])])
    return args.func(args)


def test_command_ingests_and_summarises(tmp_path, factory, capsys):
    a = factory.write_site_warc(tmp_path / "a.warc.gz", n_pages=2)
    b = factory.write_site_warc(tmp_path / "b.warc", n_pages=3, gzip=False)
    cut = tmp_path / "cut.warc"
    cut.write_bytes(b.read_bytes()[: b.read_bytes().index(b"Page 1 text.")])
    out = tmp_path / "W"
    rc = run_cli([str(a), str(b), str(cut), "--out", str(out), "--workers", "2", "--partitions", "3",
                  "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 0  # damage is a warning
    assert "cut.warc" in err and "truncated_record" in err and "1 damaged, 0 failed" in err
    work = WorkDir(out)
    assert work.n_partitions == 3
    assert work.count("pages") == 4 + 5 + 1  # the pages, the 404 and the noai page of a and b; cut's first
    cfg = yaml.safe_load((out / "_configs" / "ingest-warc.yaml").read_text())
    assert cfg["workers"] == 2 and len(cfg["files"]) == 3
    # Second run: every file already ingested; --strict turns the damage into exit 1.
    assert run_cli([str(a), str(b), "--out", str(out), "--no-progress"]) == 0
    assert "already ingested" in capsys.readouterr().err
    assert run_cli([str(cut), "--out", str(out), "--strict", "--force", "--no-progress"]) == 1


def test_bad_arguments_are_config_errors(tmp_path, factory):
    a = factory.write_site_warc(tmp_path / "a.warc.gz", n_pages=1)
    with pytest.raises(ConfigError, match="not found"):
        run_cli([str(tmp_path / "nope.warc.gz"), "--out", str(tmp_path / "W")])
    with pytest.raises(ConfigError, match="--out"):
        run_cli([str(a)])
    run_cli([str(a), "--out", str(tmp_path / "W"), "--partitions", "2", "--no-progress"])
    with pytest.raises(ConfigError, match="partitions"):
        run_cli([str(a), "--out", str(tmp_path / "W"), "--partitions", "5", "--no-progress"])
