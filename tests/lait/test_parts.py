import json
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lait.schemas import IMAGES, get_table
from lait.workdir import WorkDir, partition_of
from lait.writers import PartWriter, stats_path

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def image_row(i: int) -> dict:
    return {"image_url": f"http://x/{i}.jpg", "bytes": b"\xff" * i, "mime": "image/jpeg", "status": 200,
            "fetched_at": T0}


def test_partition_is_stable_and_spread():
    assert partition_of("http://example.com/a.jpg", 16) == partition_of("http://example.com/a.jpg", 16)
    counts = [0] * 16
    for i in range(1600):
        counts[partition_of(f"http://example.com/{i}.jpg", 16)] += 1
    assert min(counts) > 50  # roughly uniform


def test_part_appears_atomically_with_stats(tmp_path):
    work = WorkDir(tmp_path, n_partitions=4).init()
    w = work.writer("images", 3, "t1", row_group_rows=2)
    for i in range(5):
        w.write(image_row(i))
    # Before close only a hidden temporary file exists: readers see nothing.
    assert work.part_files("images") == []
    assert work.read("images").num_rows == 0
    stats = w.close()
    assert stats["rows"] == 5
    [part] = work.part_files("images")
    assert part.name == "p00003-t1.parquet"
    assert json.loads(stats_path(part).read_text())["rows"] == 5
    assert work.partitions("images") == [3]
    assert work.read("images", 3)["image_url"].to_pylist() == [f"http://x/{i}.jpg" for i in range(5)]
    assert work.count("images") == 5
    assert [r["bytes"] for r in work.iter_rows("images", 3, batch_size=2)] == [b"\xff" * i for i in range(5)]


def test_abort_leaves_no_part(tmp_path):
    work = WorkDir(tmp_path).init()
    w = work.writer("images", 0, "t")
    w.write(image_row(1))
    w.abort()
    assert work.part_files("images") == [] and not list(tmp_path.rglob(".tmp-*"))


def test_rows_are_validated_against_the_schema(tmp_path):
    w = PartWriter(tmp_path / "p00000-x.parquet", IMAGES)
    w.write({**image_row(1), "colour": "red"})
    with pytest.raises(ValueError, match="unknown columns"):
        w.close()
    w = PartWriter(tmp_path / "p00000-y.parquet", IMAGES)
    w.write({"image_url": "u", "fetched_at": T0})
    with pytest.raises(ValueError, match="status"):
        w.close()
    w = PartWriter(tmp_path / "p00000-z.parquet", IMAGES)
    w.write({**image_row(1), "status": "ok"})
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        w.close()


def test_partition_count_is_fixed_per_work_dir(tmp_path):
    WorkDir(tmp_path, n_partitions=8).init()
    assert WorkDir(tmp_path).n_partitions == 8
    with pytest.raises(ValueError, match="8 partitions"):
        WorkDir(tmp_path, n_partitions=4)


def test_a_second_lait_making_the_directory_at_once_does_not_fail_the_first(tmp_path, monkeypatch):
    """Two `lait crawl` into one new folder: the second writes lait.json, takes the lock and
    sweeps the temporary files (`clean_temp`) while the first is still writing its lait.json.
    The first must then find the directory made (and its lock taken), not fail on the rename."""
    from lait import storage

    root = tmp_path / "work"
    commit = storage.LocalOutput.commit

    raced = []

    def other_lait_first(self):
        if self.path.name == "lait.json" and not raced:
            raced.append(self.tmp)
            WorkDir(root, n_partitions=4).init()  # its own write, not swept
            WorkDir(root).clean_temp()  # under its lock: sweeps our .tmp- file
        commit(self)

    monkeypatch.setattr(storage.LocalOutput, "commit", other_lait_first)
    work = WorkDir(root, n_partitions=4).init()
    assert raced and not raced[0].exists()  # the race happened: our temporary file was swept
    assert work.is_initialized() and WorkDir(root).n_partitions == 4
    assert not list(root.glob(".tmp-*"))


def test_parts_of_several_writers_form_one_partition(tmp_path):
    work = WorkDir(tmp_path).init()
    for tag, rows in (("b", [3, 4]), ("a", [1, 2])):
        w = work.writer("images", 1, tag)
        w.write_many(image_row(i) for i in rows)
        w.close()
    assert [r["image_url"] for r in work.iter_rows("images", 1)] == [f"http://x/{i}.jpg" for i in (1, 2, 3, 4)]
    assert work.remove_parts("images", "a") == 1
    assert work.count("images") == 2


def test_empty_read_keeps_schema(tmp_path):
    t = WorkDir(tmp_path).read("candidates", 0)
    assert t.num_rows == 0 and t.schema == get_table("candidates").schema


def test_remove_parts_also_removes_temporary_files_of_that_tag(tmp_path):
    work = WorkDir(tmp_path).init()
    w = work.writer("images", 2, "stage00002")
    w.write(image_row(1))
    w.close()
    killed = work.writer("images", 2, "stage00002", row_group_rows=1)
    killed.write(image_row(2))  # flushed to a hidden temp file, never closed (writer killed)
    other = work.writer("images", 3, "stage00003", row_group_rows=1)
    other.write(image_row(3))
    assert len(list((tmp_path / "images").glob(".tmp-*"))) == 2
    assert work.remove_parts("images", "stage00002") == 1
    [left] = list((tmp_path / "images").glob(".tmp-*"))
    assert left.name.endswith("p00003-stage00003.parquet")


def test_stage_owned_tables_load_on_first_use():
    import subprocess
    import sys

    # A fresh interpreter that never imported scoring: reading near_dups/ still knows its schema.
    code = "from lait.schemas import get_table; print(get_table('near_dups').schema.names)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "image_url_a" in out.stdout
    with pytest.raises(KeyError, match="unknown table"):
        get_table("no_such_table")


def test_markers_sizes_and_local_paths(tmp_path):
    work = WorkDir(str(tmp_path / "w") + "/").init()
    assert work.root == tmp_path / "w" and not work.remote and work.url == str(tmp_path / "w")
    assert WorkDir(f"file://{tmp_path / 'w'}").root == tmp_path / "w"
    w = work.writer("images", 2, "t")
    w.write(image_row(3))
    stats = w.close()
    assert work.part_sizes("images") == [("p00002-t.parquet", stats["bytes"])]
    assert stats["bytes"] == (tmp_path / "w" / "images" / "p00002-t.parquet").stat().st_size
    for p in (0, 2, 5):
        work.mark_done("s", p, {"partition": p})
    work.mark_done("s2", 1, {})
    assert work.done_partitions("s") == {0, 2, 5} and work.done_partitions("none") == set()
    work.clear_done("s", 2)
    assert work.done_partitions("s") == {0, 5} and [d["partition"] for d in work.done_stats("s")] == [0, 5]
    work.clear_done("s")
    assert work.done_partitions("s") == set() and work.is_done("s2", 1)
    assert not list(tmp_path.rglob(".tmp-*"))


@pytest.mark.parametrize("read_ahead", [False, True])
def test_iter_rows_holds_one_row_group_at_a_time(tmp_path, read_ahead):
    """A 40 MB partition of 4 MB row groups streams in about one group's worth of Arrow memory
    (pyarrow's own `iter_batches` read the whole file ahead), two when reading ahead. Measured
    in a fresh process, since Arrow's peak counter is process-wide."""
    import os
    import random
    import subprocess
    import sys
    from pathlib import Path

    work = WorkDir(tmp_path, n_partitions=1).init()
    w = work.writer("images", 0, "t", row_group_bytes=4 << 20)
    rng = random.Random(0)
    for i in range(160):  # 256 KB of incompressible bytes per row: 16 rows per group, 10 groups
        w.write({**image_row(i), "bytes": rng.randbytes(256 << 10)})
    w.close()
    script = (
        "import sys, pyarrow as pa\n"
        "from lait.parts import WorkDir\n"
        "work = WorkDir(sys.argv[1])\n"
        f"n = sum(len(r['bytes']) for r in work.iter_rows('images', 0, batch_size=4, read_ahead={read_ahead}))\n"
        "print(n, pa.default_memory_pool().max_memory())\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert int(out[0]) == 160 * (256 << 10)
    assert int(out[1]) < 24 << 20, out  # a few 4 MB groups at most, not the 40 MB file


def test_partitioned_writer_opens_parts_lazily_and_counts_rows_per_table(tmp_path):
    from lait.parts import PartitionedWriter

    work = WorkDir(tmp_path, n_partitions=4).init()
    out = PartitionedWriter(work, "w1", extra_stats={"writer": "test"})
    for i in range(6):
        out.write("images", i % 2, image_row(i))
    out.reject("filter/min_side", 3, image_url="http://x/9.jpg", detail="x" * 2000)
    assert work.part_files("images") == []  # nothing visible before close
    assert out.close() == {"images": 6, "rejected": 1}
    assert [p.name for p in work.part_files("images")] == ["p00000-w1.parquet", "p00001-w1.parquet"]
    assert json.loads(stats_path(work.part_files("images")[0]).read_text())["writer"] == "test"
    [rej] = work.read("rejected").to_pylist()
    assert rej["reason"] == "filter/min_side" and len(rej["detail"]) == 1000


def test_partitioned_writer_flush_writes_the_row_group_close_would_write(tmp_path):
    """A flush at the end of a task writes each open part's buffered rows as the row group that
    `close` would have written: the files are the same; rows after a flush start a new group."""
    from lait.parts import PartitionedWriter

    parts = {}
    for name, flush_at in (("plain", None), ("flushed", 6), ("middle", 3)):
        work = WorkDir(tmp_path / name, n_partitions=4).init()
        out = PartitionedWriter(work, "w1")
        for i in range(6):
            if i == flush_at:
                out.flush()
            out.write("images", i % 2, image_row(i))
        if flush_at == 6:
            out.flush()
        out.close()
        parts[name] = work.part_files("images")
    for a, b in zip(parts["plain"], parts["flushed"]):
        assert a.read_bytes() == b.read_bytes()
    assert [pq.ParquetFile(p).num_row_groups for p in parts["plain"]] == [1, 1]
    assert [pq.ParquetFile(p).num_row_groups for p in parts["middle"]] == [2, 2]
    assert pq.read_table(parts["middle"][0]).equals(pq.read_table(parts["plain"][0]))


def test_partitioned_writer_refuses_unregistered_reasons_and_second_parts(tmp_path):
    from lait.parts import PartitionedWriter

    work = WorkDir(tmp_path, n_partitions=4).init()
    out = PartitionedWriter(work, "w1")
    with pytest.raises(ValueError, match="unregistered drop reason 'filter/no_such_rule'"):
        out.reject("filter/no_such_rule", 0, image_url="u")
    out.write("images", 2, image_row(1))
    assert out.commit("images", 2)["rows"] == 1
    with pytest.raises(RuntimeError, match="already committed"):
        out.write("images", 2, image_row(2))  # would replace the committed part
    out.write("images", 1, image_row(3))
    out.abort()
    assert [p.name for p in work.part_files("images")] == ["p00002-w1.parquet"]
    assert not list(tmp_path.rglob(".tmp-*"))


def test_rolling_writer_commits_parts_under_sequential_tags(tmp_path):
    from lait.parts import RollingPartitionedWriter

    work = WorkDir(tmp_path, n_partitions=2).init()
    events = []
    out = RollingPartitionedWriter(work, "crawl-r", part_rows=3, part_bytes=1 << 30, part_seconds=3600,
                                   on_event=events.append)
    for i in range(7):
        out.write("images", 0, image_row(i))
    assert [p.name for p in work.part_files("images")] == ["p00000-crawl-r-00001.parquet",
                                                           "p00000-crawl-r-00002.parquet"]
    assert out.close() == {"images": 7}
    # The last part at close, then the word that everything written is durable (the Redis lease's cue).
    assert events == ["parts_committed"] * 3 + ["all_committed"]
    assert [r["image_url"] for r in work.iter_rows("images", 0)] == [f"http://x/{i}.jpg" for i in range(7)]


def test_table_of_rows_is_arrows_own_conversion():
    from lait.arrow_rows import table_of_rows
    from lait.schemas import IMAGES_OK

    rows = [{**image_row(i), "bytes": [b"\xff\xd8" * i, None, b""][i % 3], "page_url": [None, "p", "é"][i % 3],
             "width": i, "height": 2 * i, "format": "JPEG", "sha256": "0" * 64, "phash": "1" * 16}
            for i in range(10)]
    for chunk in (rows, rows[1:2], rows[2:3], []):
        expected = pa.Table.from_pylist(chunk, schema=IMAGES_OK)
        got = table_of_rows(chunk, IMAGES_OK)
        got.validate(full=True)
        assert got.schema == expected.schema and got.equals(expected)
    # Memoryviews are bytes; values Arrow converts itself (a str) take Arrow's path.
    views = [{**r, "bytes": None if r["bytes"] is None else memoryview(r["bytes"])} for r in rows]
    assert table_of_rows(views, IMAGES_OK).equals(pa.Table.from_pylist(rows, schema=IMAGES_OK))
    odd = [{**rows[1], "bytes": "text"}]
    assert table_of_rows(odd, IMAGES_OK).column("bytes").to_pylist() == [b"text"]
    with pytest.raises((TypeError, pa.ArrowInvalid)):
        table_of_rows([{**rows[1], "bytes": 7}], IMAGES_OK)


def test_iter_rows_views_are_the_bytes_and_write_back_the_same_parts(tmp_path):
    """Rows read as views and written again give the same row groups as rows of bytes: a view
    counts its bytes toward the row group limit as the bytes themselves do."""
    work = WorkDir(tmp_path, n_partitions=1).init()
    w = work.writer("images", 0, "src", row_group_bytes=1000)
    for i in range(40):
        w.write({**image_row(i * 7 % 90), "bytes": None if i % 9 == 4 else bytes((i * 37 + k) % 256 for k in range(13 * i))})
    w.close()
    plain = list(work.iter_rows("images", 0, batch_size=3))
    views = list(work.iter_rows("images", 0, batch_size=3, views=True))
    assert [{k: v for k, v in r.items() if k != "bytes"} for r in views] == \
           [{k: v for k, v in r.items() if k != "bytes"} for r in plain]
    assert [r["bytes"] if r["bytes"] is None else type(r["bytes"]) for r in views].count(memoryview) == 36
    assert [None if r["bytes"] is None else bytes(r["bytes"]) for r in views] == [r["bytes"] for r in plain]
    assert all(r["bytes"] is None or r["bytes"].readonly for r in views)
    for tag, rows in (("plain", plain), ("views", views)):
        out = work.writer("images", 0, tag, row_group_bytes=1000)
        out.write_many(rows)
        out.close()
    a, b = (pq.ParquetFile(work.part_path("images", 0, tag)) for tag in ("plain", "views"))
    assert a.metadata.num_row_groups == b.metadata.num_row_groups > 3
    assert [a.metadata.row_group(i).num_rows for i in range(a.metadata.num_row_groups)] == \
           [b.metadata.row_group(i).num_rows for i in range(b.metadata.num_row_groups)]
    assert a.read().equals(b.read())
    assert b.read().equals(pq.read_table(work.part_path("images", 0, "src")))


def test_write_table_writes_the_file_that_rows_one_by_one_write(tmp_path):
    """`PartWriter.write_table` cuts row groups where `write` would (by rows, and by bytes, where
    a string counts its characters), so a part written from Arrow is the same file byte for byte;
    tables and rows mix in order. Required columns, unknown columns and types are checked."""
    from lait.schemas import IMAGES_OK

    rows = [{**image_row(i), "bytes": None if i % 7 == 3 else bytes([i % 256]) * (i * 11 % 300),
             "page_url": [None, "p", "é" * 40, "日本語" * 30][i % 4], "width": i, "height": 2 * i,
             "format": "JPEG", "sha256": "0" * 64, "phash": "1" * 16} for i in range(200)]
    table = pa.Table.from_pylist(rows, schema=IMAGES_OK)
    cases = {
        "rows": [("rows", rows)],
        "table": [("table", table)],
        "slices": [("table", table.slice(0, 33)), ("table", table.slice(33, 1)), ("table", table.slice(34))],
        "mixed": [("rows", rows[:50]), ("table", table.slice(50, 70)), ("rows", rows[120:121]),
                  ("table", table.slice(121).select(["image_url", "bytes", "status", "fetched_at", "mime",
                                                     "page_url", "width", "height", "format", "sha256",
                                                     "phash"]))],
    }
    for limits in ({"row_group_rows": 16}, {"row_group_bytes": 2000}, {"row_group_rows": 40, "row_group_bytes": 5000},
                   {}):
        files = {}
        for name, steps in cases.items():
            path = tmp_path / f"p00000-{name}-{len(files)}-{sorted(limits.items())}.parquet".replace(" ", "")
            w = PartWriter(path, IMAGES_OK, **limits)
            for kind, data in steps:
                w.write_many(data) if kind == "rows" else w.write_table(data)
            assert w.close()["rows"] == 200
            files[name] = path.read_bytes()
        assert pq.ParquetFile(path).num_row_groups > (1 if limits else 0)
        assert files["table"] == files["rows"] and files["slices"] == files["rows"] and files["mixed"] == files["rows"]
        # Row groups of a table written behind, on a helper thread, are the same too.
        from lait.parts import PartitionedWriter

        work = WorkDir(tmp_path / f"behind-{len(limits)}-{limits.get('row_group_rows')}", n_partitions=1).init()
        out = PartitionedWriter(work, "behind", **limits)
        with out.writing_behind():
            out.write_table("images_ok", 0, table.slice(0, 90))
            out.write_table("images_ok", 0, table.slice(90))
        out.close()
        assert work.part_path("images_ok", 0, "behind").read_bytes() == files["rows"]

    w = PartWriter(tmp_path / "p00000-bad.parquet", IMAGES_OK)
    with pytest.raises(ValueError, match="unknown columns"):
        w.write_table(table.append_column("colour", pa.array(["red"] * 200)))
    with pytest.raises(ValueError, match="sha256"):
        w.write_table(table.drop_columns(["sha256"]))
    with pytest.raises(ValueError, match="width"):
        w.write_table(table.set_column(table.schema.get_field_index("width"), "width", pa.array(["x"] * 200)))


def _write_mixed(out, rows: int = 30) -> None:
    """Rows into two tables and three partitions, a commit and a flush on the way."""
    for i in range(rows):
        part = i % 3 if i <= 12 else i % 2
        out.write("images", part, {**image_row(i), "bytes": bytes((i * 31 + k) % 256 for k in range(40 * i))})
        if i % 4 == 0:
            out.reject("filter/min_side", part, image_url=f"http://x/{i}.jpg", detail=f"{i}px")
        if i == 12:
            out.commit("images", 2)  # committed inside the block: its queued row groups first
        if i == 20:
            out.flush()


def test_writing_behind_gives_the_same_parts(tmp_path, monkeypatch):
    """Row groups written on the background thread make the same files, byte for byte, as
    written inline; the rows counted and the stats are the same too."""
    import threading

    from lait.parts import PartitionedWriter
    from lait.writers import helper_thread

    real = pq.ParquetWriter.write_table
    threads = []

    def recording(self, table, *args, **kwargs):
        threads.append(threading.current_thread().name.split("_")[0])
        return real(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", recording)
    files = {}
    for mode in ("inline", "behind", "shared"):
        work = WorkDir(tmp_path / mode, n_partitions=3).init()
        out = PartitionedWriter(work, "w1", row_group_bytes=2000)
        if mode == "inline":
            _write_mixed(out)
        else:
            with helper_thread("shared") as shared:
                with out.writing_behind(shared if mode == "shared" else None):
                    _write_mixed(out)
                    assert out._background is not None
                assert shared.submit(lambda: 1).result() == 1  # left running
            assert out._background is None and all(w.background is None for w in out._open.values())
        rows = out.close()
        files[mode + " threads"], threads[:] = sorted(set(threads)), []
        files[mode] = {p.relative_to(work.root).as_posix(): p.read_bytes()
                       for p in sorted(work.root.rglob("*")) if p.is_file()}
        files[mode + " rows"] = rows
    assert files["inline rows"] == files["behind rows"] == files["shared rows"] == {"images": 30, "rejected": 8}
    # Inside the block every row group was written on the thread; after it, inline again.
    assert files["inline threads"] == ["MainThread"]
    assert files["behind threads"] == ["MainThread", "lait-write"]
    assert files["shared threads"] == ["MainThread", "shared"]
    assert files["inline"].keys() == files["behind"].keys() == files["shared"].keys()
    assert any(pq.ParquetFile(io_bytes(b)).num_row_groups > 3 for name, b in files["behind"].items()
               if name.startswith("images/") and name.endswith(".parquet"))
    for name, data in files["inline"].items():
        assert files["behind"][name] == files["shared"][name] == data, name


def io_bytes(data: bytes):
    import io

    return io.BytesIO(data)


def test_writing_behind_raises_a_failed_write_and_aborts_cleanly(tmp_path, monkeypatch):
    """A row group whose write fails on the thread fails the block (or the next flush): the
    error is the writer's own, and aborting leaves no part and no temporary file."""
    from lait.parts import PartitionedWriter

    real = pq.ParquetWriter.write_table
    calls = []

    def failing(self, table, *args, **kwargs):
        calls.append(table.num_rows)
        if len(calls) == 3:
            raise OSError("disk full (test)")
        return real(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", failing)
    work = WorkDir(tmp_path, n_partitions=1).init()
    out = PartitionedWriter(work, "w1", row_group_rows=2)
    with pytest.raises(OSError, match="disk full"):
        with out.writing_behind():
            for i in range(20):
                out.write("images", 0, image_row(i))
            out.flush()
    out.abort()
    assert len(calls) >= 3
    assert work.part_files("images") == [] and not list(tmp_path.rglob(".tmp-*"))

    # An error of the caller's own wins over the queued writes, which still finish first.
    calls.clear()
    monkeypatch.setattr(pq.ParquetWriter, "write_table", real)
    out = PartitionedWriter(work, "w2", row_group_rows=2)
    with pytest.raises(KeyError, match="caller"):
        with out.writing_behind():
            for i in range(5):
                out.write("images", 0, image_row(i))
            raise KeyError("caller")
    out.abort()
    assert work.part_files("images") == [] and not list(tmp_path.rglob(".tmp-*"))


def test_iter_rows_read_ahead_gives_the_same_rows(tmp_path):
    """Reading the next row group on a thread changes nothing the caller sees: the same rows in
    the same order over several parts and row groups, as bytes or views; a reader left early
    stops its thread."""
    import threading

    from lait.writers import helper_thread

    work = WorkDir(tmp_path, n_partitions=2).init()
    for tag, start in (("a", 0), ("b", 25)):
        w = work.writer("images", 1, tag, row_group_rows=4)
        w.write_many({**image_row(i), "bytes": None if i % 7 == 3 else bytes([i]) * (50 * i)} for i in range(start, start + 25))
        w.close()
    for views in (False, True):
        plain = list(work.iter_rows("images", 1, batch_size=3, views=views))
        ahead = list(work.iter_rows("images", 1, batch_size=3, views=views, read_ahead=True))
        assert len(plain) == 50 and [r["image_url"] for r in plain] == [f"http://x/{i}.jpg" for i in range(50)]
        norm = [{**r, "bytes": None if r["bytes"] is None else bytes(r["bytes"])} for r in ahead]
        assert norm == [{**r, "bytes": None if r["bytes"] is None else bytes(r["bytes"])} for r in plain]
    assert list(work.iter_rows("images", 0, read_ahead=True)) == []
    with helper_thread("shared") as shared:  # a shared helper: used, and left running
        got = list(work.iter_rows("images", 1, read_ahead=shared))
        assert [r["image_url"] for r in got] == [f"http://x/{i}.jpg" for i in range(50)]
        assert shared.submit(lambda: threading.current_thread().name).result().startswith("shared")
    rows = work.iter_rows("images", 1, batch_size=2, read_ahead=True)
    assert next(rows)["image_url"] == "http://x/0.jpg"
    assert any(t.name.startswith("lait-read") for t in threading.enumerate())
    rows.close()
    assert not any(t.name.startswith("lait-read") for t in threading.enumerate())
