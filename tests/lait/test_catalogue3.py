"""Issue 59, the third catalogue: what trying lait as an attacker or a new user found lait doing
silently wrong, or reporting in a traceback. Each case is the data that provoked it; each ends
in what a user can act on: one line on stderr, a hint that is true when followed, or settings
kept rather than silently replaced by the defaults.

(URL-list decoding in detail lives beside its code: tests/crawler/download/test_url_list.py.)
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from kit import build_data as data
from kit.pipeline_kit import NO_GATES


def lait(*argv: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    if "stdout" not in kwargs:
        kwargs["capture_output"] = True
    return subprocess.run([sys.executable, "-m", "lait", *argv], text=True, timeout=timeout, **kwargs)


def one_line(proc: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """The one line a refused or stopped command printed, no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code and len(lines) == 1, (proc.returncode, proc.stderr[-3000:])
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_page_work(root: Path) -> Path:
    """What a crawl of one page with one photo leaves: the input of stages 2 and 3, in seconds."""
    from lait.parts import PartitionedWriter
    from lait.workdir import WorkDir

    work = WorkDir(root, n_partitions=1).init()
    now = datetime(2024, 1, 1, tzinfo=timezone.utc)
    html = b"<html><body><img src='/a.jpg' alt='A red bus waiting at a stop in the rain'></body></html>"
    parts = PartitionedWriter(work, "crawl-test")
    parts.write("pages", 0, {"url": "http://site.test/p.html", "status": 200, "fetched_at": now,
                             "headers": {"content-type": "text/html"}, "content_type": "text/html; charset=utf-8",
                             "html": html, "encoding": "utf-8", "depth": 0, "referer": None, "error": None})
    parts.write("images", 0, {"image_url": "http://site.test/a.jpg", "page_url": "http://site.test/p.html",
                              "bytes": data.photo(0), "mime": "image/jpeg", "status": 200, "fetched_at": now,
                              "error": None})
    parts.close()
    return root


def copy_work(src: Path, tmp_path: Path) -> Path:
    """A copy of a module's read-only work directory for one test to change."""
    work = tmp_path / "work"
    shutil.copytree(src, work, symlinks=True)
    return work


@pytest.fixture(scope="module")
def cleaned_once(tmp_path_factory) -> Path:
    """The one-page work directory after `lait filter` (model gates off, --min-side 200) and
    `lait clean` (read only: copy it to change it)."""
    work = one_page_work(tmp_path_factory.mktemp("cleaned") / "work")
    for argv in (["filter", str(work), *NO_GATES, "--min-side", "200"], ["clean", str(work)]):
        proc = lait(*argv, "--workers", "1", "--no-progress")
        assert proc.returncode == 0, proc.stderr[-3000:]
    return work


@pytest.fixture
def cleaned(cleaned_once, tmp_path) -> Path:
    return copy_work(cleaned_once, tmp_path)


@pytest.fixture(scope="module")
def scored_once(tmp_path_factory) -> Path:
    """A scored work directory (`build_data.make_work`), not built yet (read only)."""
    work = tmp_path_factory.mktemp("scored") / "work"
    data.make_work(work)
    return work


@pytest.fixture
def scored(scored_once, tmp_path) -> Path:
    return copy_work(scored_once, tmp_path)


# -- row 4: `lait run --config` keeps the recorded settings of the stages the file leaves out -------

def _filter_settings(work: Path) -> dict:
    return yaml.safe_load((work / "_configs" / "filter.yaml").read_text())


def test_run_with_a_config_of_later_stages_keeps_stage_2s_recorded_settings(cleaned, tmp_path):
    """After `lait filter W --face-model none`, `lait run W --config X` with no `filter:` section
    redid stage 2 with the defaults (the model gates on, min_side 300). Now it continues with
    the settings stage 2 was last made with, as `lait filter W` does, and says so."""
    images_ok = files(cleaned / "images_ok")
    later = tmp_path / "later.yaml"
    later.write_text("clean: {languages: [en, de]}\nbuild: {samples_per_shard: 50}\n")

    proc = lait("run", str(cleaned), "--config", str(later), "--to", "clean", "--workers", "1", "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "has no section for" in line]
    assert len(said) == 1 and "for filter:" in said[0] and "filter.yaml" in said[0], proc.stderr[-3000:]
    assert "filter: 0 done, 1 up to date, 0 failed" in proc.stderr, proc.stderr[-3000:]
    assert "clean: 1 done" in proc.stderr  # the file's own section is used: languages en -> en, de
    settings = _filter_settings(cleaned)
    assert (settings["unsafe_model"], settings["min_side"]) == ("none", 200)
    assert files(cleaned / "images_ok") == images_ok
    # `lait status --config` says what `lait run --config` would do: stage 2 is current.
    status = lait("status", str(cleaned), "--config", str(later))
    assert status.returncode == 0, status.stderr[-3000:]
    assert re.search(r"^filter\s+1\s+1\s+0\s+0\s*$", status.stdout, re.M), status.stdout


def test_run_with_a_config_that_changes_a_stage_2_setting_redoes_stage_2(cleaned, tmp_path):
    """The other side: a `filter:` section is the stage's settings over the defaults (as `lait
    filter --config`), and a change in it redoes stage 2."""
    changed = tmp_path / "changed.yaml"
    changed.write_text("filter: {min_side: 250, unsafe_model: none}\n")
    proc = lait("run", str(cleaned), "--config", str(changed), "--to", "filter", "--workers", "1", "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "min_side 200 -> 250" in proc.stderr and "filter: 1 done" in proc.stderr, proc.stderr[-3000:]
    assert _filter_settings(cleaned)["min_side"] == 250


# -- row 7: a part whose columns are not its table's ------------------------------------------------

def _damage_score_column(part: Path, how: str) -> None:
    table = pq.read_table(part)
    if how == "dropped":
        table = table.drop_columns(["score"])
    else:
        i = table.schema.get_field_index("score")
        table = table.set_column(i, "score", table.column("score").cast(pa.string()))
    pq.write_table(table, part)


@pytest.mark.parametrize("how", ["dropped", "text"])
def test_a_scored_part_without_its_numeric_score_is_named_by_verify_and_stops_the_build(scored, how):
    """`verify` said 'all intact'; `build --force` failed with `ArrowInvalid: Column 'score' ...
    contains nulls` naming the partition (dropped), or built from numbers read back out of text
    (text). Now both name the file and the column."""
    part = scored / "scored" / "p00001-input.parquet"
    _damage_score_column(part, how)

    found = lait("verify", str(scored))
    assert found.returncode == 1 and "all intact" not in found.stderr, found.stderr[-3000:]
    (line,) = [line for line in found.stderr.splitlines() if line.startswith("scored/")]
    assert line.startswith("scored/p00001-input.parquet (partition 00001): ") and "'score'" in line, line
    assert ("has no column 'score'" if how == "dropped" else "holds string, not the float") in line, line

    build = lait("build", str(scored), "--force", "--workers", "1", "--no-progress")
    assert build.returncode == 1, build.stderr[-3000:]
    assert "Traceback" not in build.stderr and "ArrowInvalid" not in build.stderr, build.stderr[-3000:]
    assert any(str(part) in line and "'score'" in line for line in build.stderr.splitlines()), build.stderr[-3000:]
    assert not (scored / "shards").exists() or not list((scored / "shards").glob("*.tar"))


def test_a_part_written_before_a_nullable_column_existed_is_still_intact(scored):
    """A part lacking a nullable column (`license`, added to `scored/` later) is an older part,
    not a damaged one: it reads as nulls there, and verify and the build take it."""
    part = scored / "scored" / "p00001-input.parquet"
    pq.write_table(pq.read_table(part).drop_columns(["license", "image_license"]), part)
    assert "all intact" in lait("verify", str(scored)).stderr
    build = lait("build", str(scored), "--workers", "1", "--no-progress")
    assert build.returncode == 0, build.stderr[-3000:]


# -- row 8: verify's hint for a damaged part is what really redoes it -------------------------------

def test_following_verifys_hint_for_a_truncated_candidates_part_redoes_it(cleaned):
    """verify said 'lait clean redoes it', but `lait clean` called the partition up to date (its
    task's marker stands). The hint now names the commands that do, and running them as printed
    brings the part back."""
    (part,) = (cleaned / "candidates").glob("*.parquet")
    rows = pq.read_table(part).to_pylist()
    raw = part.read_bytes()
    part.write_bytes(raw[: len(raw) // 2])

    found = lait("verify", str(cleaned))
    assert found.returncode == 1, found.stderr[-3000:]
    (line,) = [line for line in found.stderr.splitlines() if line.startswith("candidates/")]
    commands = re.findall(r"`([^`]+)`", line)
    assert [c.split()[:2] for c in commands] == [["lait", "verify"], ["lait", "clean"]], line
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "lait"
        proc = lait(*argv[1:])
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "clean: 1 done" in proc.stderr, proc.stderr[-3000:]

    again = lait("verify", str(cleaned))
    assert again.returncode == 0 and "all intact" in again.stderr, again.stderr[-3000:]
    (part,) = (cleaned / "candidates").glob("*.parquet")
    assert pq.read_table(part).to_pylist() == rows


# -- row 9: a config file has a size limit -----------------------------------------------------------

def test_a_config_file_over_1_mib_is_refused_unread(scored, tmp_path):
    """A 17.5 MB YAML config (2.5 M list items) took 53 s and 1.5 GB to parse, and `lait filter`
    sat silent for two minutes. A file over 1 MiB is now refused before it is parsed: this one
    ends in invalid YAML, which a parse would have reported instead."""
    big = tmp_path / "big.yaml"
    big.write_text("filter:\n  formats:\n" + "  - JPEG\n" * 150_000 + "  ]: not yaml\n")
    assert big.stat().st_size > 1 << 20
    work, before = str(scored), files(scored)
    for argv in (["filter", work, "--config", str(big)], ["run", work, "--config", str(big)],
                 ["status", work, "--config", str(big)]):
        line = one_line(lait(*argv), 2, f"lait {argv[0]}", str(big), "larger than 1 MiB")
        assert "YAML" not in line
    assert files(scored) == before
    assert "at most 1 MiB" in " ".join(lait("filter", "--help").stdout.split())
    assert "at most 1 MiB" in " ".join(lait("run", "--help").stdout.split())


def test_a_config_file_of_exactly_1_mib_is_read(tmp_path):
    from lait.config import MAX_CONFIG_BYTES, ConfigError, read_yaml_mapping

    path = tmp_path / "c.yaml"
    head = "min_side: 200\n# "
    path.write_text(head + "x" * (MAX_CONFIG_BYTES - len(head) - 1) + "\n")
    assert path.stat().st_size == MAX_CONFIG_BYTES
    assert read_yaml_mapping(path) == {"min_side": 200}
    path.write_text(head + "x" * (MAX_CONFIG_BYTES - len(head)) + "\n")
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        read_yaml_mapping(path)


# -- row 10: a URL list in another encoding -----------------------------------------------------------

LATIN_1 = "url,caption\nhttp://a.test/1.jpg,un café noir\nhttp://a.test/2.jpg,crème brûlée\n".encode("latin-1")


def test_a_latin_1_url_list_is_refused_by_default_and_read_with_its_encoding(tmp_path):
    """A Latin-1 CSV's captions became `caf\\ufffd` without a word. UTF-8 is now the stated
    default, a byte that is not UTF-8 is one line naming where it is, and --encoding reads it."""
    urls = tmp_path / "urls.csv"
    urls.write_bytes(LATIN_1)
    out = tmp_path / "out"
    one_line(lait("download", str(urls), "--out", str(out), "--no-fetch", "--no-progress"), 2,
             "lait download", "urls.csv", "not CSV text in UTF-8", "byte e9 at offset 38, line 2", "--encoding")
    assert not out.exists()

    proc = lait("download", str(urls), "--out", str(out), "--no-fetch", "--no-progress", "--encoding", "latin-1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    from lait.workdir import WorkDir

    assert sorted(WorkDir(out).read("url_list").column("caption").to_pylist()) == ["crème brûlée", "un café noir"]

    other = tmp_path / "other"
    proc = lait("download", str(urls), "--out", str(other), "--no-fetch", "--no-progress",
                "--encoding-errors", "replace")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "undecodable bytes read as U+FFFD (--encoding-errors replace): 4" in proc.stderr, proc.stderr[-3000:]

    one_line(lait("download", str(urls), "--out", str(other), "--no-fetch", "--encoding", "latin-9x"), 2,
             "lait download", "--encoding 'latin-9x'", "not an encoding")


# -- row 11: a reader that stops early -----------------------------------------------------------------

def _closed_by_head(argv: list[str]) -> subprocess.CompletedProcess:
    """`lait ARGV | head -1` where head has its line already: it has exited before lait writes,
    so every write of lait's meets a pipe with no reader (what `| head -3` does to a longer
    output, without depending on who is faster)."""
    read_end, write_end = os.pipe()
    head = subprocess.Popen(["head", "-1"], stdin=read_end, stdout=subprocess.PIPE)
    os.close(read_end)
    try:
        os.write(write_end, b"a first line\n")
        assert head.communicate(timeout=60)[0] == b"a first line\n"
        return lait(*argv, stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("argv", [["status", "{w}"], ["stats", "{w}"], ["models"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(scored, argv):
    """`lait status W | head -3`: a BrokenPipeError traceback. Now exit 141 (128 + SIGPIPE, as a
    shell's own tools end), nothing on stderr."""
    proc = _closed_by_head([a.format(w=scored) for a in argv])
    assert (proc.returncode, proc.stderr) == (141, ""), (proc.returncode, proc.stderr[-3000:])


def test_status_piped_into_head_in_a_shell(scored):
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    command = f"{shlex.quote(sys.executable)} -m lait status {shlex.quote(str(scored))} | head -1; " \
              "exit ${PIPESTATUS[0]}"
    proc = subprocess.run([bash, "-c", command], capture_output=True, text=True, timeout=300)
    # 0 when lait wrote everything before head left, 141 when head left first: never a traceback.
    assert proc.returncode in (0, 141) and proc.stderr == "", (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout == f"{scored}\n"
