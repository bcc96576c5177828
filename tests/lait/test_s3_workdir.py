"""Work directories on S3, against a real S3-compatible server: moto's standalone server on a
loopback port, started here as a subprocess and reached through s3fs like any S3 endpoint.

The acceptance test crawls the built-in web straight into `s3://BUCKET/crawl`, downloads a copy
into a local folder, runs `lait filter/clean/score/build` (2 workers: forked, and spawned for
scoring) on the local copy and on an S3 copy, and requires the same tables and byte-identical
shard members; then the same on a local Ray cluster, with `lait documents` after the stages
(this was test_ray_pipeline's chain on a local disk: one Ray chain now tests both).
"""

from __future__ import annotations

import copy
import gc
import importlib.util
import json
import multiprocessing
import os
import pickle
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from kit.pipeline_kit import TINY_CLIP, shard_members, stage_commands, tables  # noqa: E402
from lait import storage
from lait.app.cli import main as lait
from lait.executor import LocalExecutor
from lait.storage import Location, RemotePath
from lait.workdir import WorkDir
from lait.writers import stats_path

HERE = Path(__file__).parent
from kit import toy_stage as toy  # noqa: E402

BLOCK = 5 << 20  # S3's smallest multipart part: parts above it go up as multipart uploads


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory):
    """moto's S3 server in a subprocess on a free loopback port; its URL."""
    for module in ("moto", "s3fs", "boto3", "flask"):  # flask: what moto[server] adds
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install 'lait[dev]')")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # The server logs every request: into a file, never a pipe nobody reads (it would fill and block).
    log_path = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto server did not start: {log_path.read_text()[-2000:]}") from None
            time.sleep(0.2)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def aws(moto_endpoint):
    """The standard AWS variables pointing this process, and every process it starts (forked
    and spawned workers, the Scrapy subprocess, Ray), at the moto server."""
    with pytest.MonkeyPatch.context() as mp:
        for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "LAIT_STORAGE_OPTIONS"):
            mp.delenv(var, raising=False)
        mp.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
        mp.setenv("AWS_ACCESS_KEY_ID", "lait-test")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "lait-test-secret")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        yield moto_endpoint


def new_bucket() -> str:
    import boto3

    name = f"lait-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=name)
    return f"s3://{name}"


@pytest.fixture
def s3(aws):
    """A fresh, empty bucket: its URL (`s3://NAME`)."""
    return new_bucket()


def keys(bucket_url: str) -> list[str]:
    import boto3

    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket_url[5:])
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def pending_uploads(bucket_url: str) -> list:
    import boto3

    return boto3.client("s3").list_multipart_uploads(Bucket=bucket_url[5:]).get("Uploads", [])


def image_row(i: int, size: int = 10) -> dict:
    return {"image_url": f"http://x/{i}.jpg", "bytes": os.urandom(size), "mime": "image/jpeg", "status": 200,
            "fetched_at": toy.T0}


# -- the storage layer ------------------------------------------------------------------------
def test_remote_path_behaves_like_the_pathlib_it_replaces():
    p = RemotePath("s3://bkt/run/") / "images" / "p00001-t.parquet"
    assert str(p) == "s3://bkt/run/images/p00001-t.parquet"
    assert p.name == "p00001-t.parquet" and p.parent == RemotePath("s3://bkt/run/images")
    assert stats_path(p) == RemotePath("s3://bkt/run/images/p00001-t.stats.json")
    assert (RemotePath("s3://bkt/run/shards") / "00003.tar").with_suffix(".parquet").name == "00003.parquet"
    assert p.bucket == RemotePath("s3://bkt")
    assert storage.location("s3://bkt/x") == RemotePath("s3://bkt/x")
    assert storage.location("work/x") == Path("work/x") and storage.location("file:///tmp/w") == Path("/tmp/w")
    with pytest.raises(TypeError):
        open(p)  # never mistaken for a local path


def test_part_round_trip_markers_and_configs(s3):
    url = f"{s3}/run"
    work = WorkDir(url, n_partitions=4).init()
    assert keys(s3) == ["run/lait.json"] and work.remote and work.url == url
    w = work.writer("images", 3, "t1", row_group_rows=2)
    rows = [image_row(i) for i in range(5)]
    w.write_many(rows)
    w._flush()
    # Row groups were written, but the upload is not complete: nothing to list or read.
    assert work.part_files("images") == [] and work.read("images").num_rows == 0
    assert keys(s3) == ["run/lait.json"]
    stats = w.close()
    [part] = work.part_files("images")
    assert part == RemotePath(f"{url}/images/p00003-t1.parquet")
    assert json.loads(storage.read_bytes(stats_path(part))) == stats and stats["rows"] == 5
    assert stats["bytes"] == storage.size(part)
    assert work.partitions("images") == [3] and work.count("images") == 5
    assert work.read("images", 3)["bytes"].to_pylist() == [r["bytes"] for r in rows]
    assert [r["image_url"] for r in work.iter_rows("images", 3, batch_size=2)] == [r["image_url"] for r in rows]
    assert work.part_sizes("images") == [("p00003-t1.parquet", stats["bytes"])]

    assert WorkDir(url).n_partitions == 4
    with pytest.raises(ValueError, match="4 partitions"):
        WorkDir(url, n_partitions=8)

    assert not work.is_done("toy", 3)
    work.mark_done("toy", 3, {"partition": 3})
    work.mark_done("toy", 1, {"partition": 1})
    work.mark_done("toy2", 1, {"partition": 1})
    assert work.is_done("toy", 3) and [s["partition"] for s in work.done_stats("toy")] == [1, 3]
    assert work.done_partitions("toy") == {1, 3} and work.done_partitions("nothing") == set()
    work.clear_done("toy", 3)
    assert not work.is_done("toy", 3) and work.is_done("toy", 1)
    work.clear_done("toy")  # a prefix of toy2: its markers stay
    assert work.done_stats("toy") == [] and work.is_done("toy2", 1)

    assert storage.read_text(work.write_config("filter", "min_side: 300\n")) == "min_side: 300\n"
    assert work.remove_parts("images", "t1") == 1
    assert work.part_files("images") == [] and not any(k.startswith("run/images/") for k in keys(s3))
    work.clean_temp()  # nothing to clean remotely, and no error


def test_aborted_or_dropped_writer_leaves_no_object(s3, monkeypatch):
    # A 5 MiB block, so that 7 MiB of rows start a multipart upload before the abort.
    monkeypatch.setenv("LAIT_STORAGE_OPTIONS", json.dumps({"default_block_size": BLOCK}))
    work = WorkDir(f"{s3}/run").init()
    w = work.writer("images", 0, "aborted", row_group_rows=1)
    for i in range(7):
        w.write(image_row(i, 1 << 20))
    assert pending_uploads(s3), "expected a multipart upload in flight"
    w.abort()
    assert pending_uploads(s3) == []
    dropped = work.writer("images", 1, "dropped", row_group_rows=1)
    dropped.write(image_row(1))
    dropped._flush()
    del dropped  # a writer lost without close (an error path, interpreter exit)
    gc.collect()
    assert keys(s3) == ["run/lait.json"] and work.part_files("images") == []

    big = work.writer("images", 2, "big", row_group_rows=1)
    rows = [image_row(i, 1 << 20) for i in range(7)]
    big.write_many(rows)
    assert big.close()["rows"] == 7 and pending_uploads(s3) == []
    assert work.read("images", 2)["bytes"].to_pylist() == [r["bytes"] for r in rows]


LIST_AND_WRITE = """
import sys
from lait.workdir import WorkDir
from datetime import datetime, timezone
work = WorkDir(sys.argv[1])
w = work.writer("images", 2, sys.argv[2])
w.write({"image_url": "http://x/" + sys.argv[2], "mime": "image/jpeg", "status": 200,
         "fetched_at": datetime(2026, 1, 1, tzinfo=timezone.utc)})
w.close()
work.mark_done("other", 2, {})
"""


@pytest.mark.parametrize("listings_cache", [False, True], ids=["default", "cache-forced-on"])
def test_listing_sees_parts_another_process_wrote(s3, monkeypatch, listings_cache):
    if listings_cache:  # even with s3fs's listings cache turned on, lait lists afresh
        monkeypatch.setenv("LAIT_STORAGE_OPTIONS", json.dumps({"use_listings_cache": True}))
    work = WorkDir(f"{s3}/run", n_partitions=4).init()
    work.writer("images", 1, "here").write_many([image_row(1)])  # never closed: invisible
    assert work.part_files("images") == [] and work.partitions("images") == []
    assert not work.is_done("other", 2) and work.done_stats("other") == []
    for tag in ("there1", "there2"):
        proc = subprocess.run([sys.executable, "-c", LIST_AND_WRITE, work.url, tag], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert tag in [p.name.split("-", 1)[1][:-8] for p in work.part_files("images")]
    assert work.partitions("images") == [2] and work.count("images", 2) == 2
    assert work.is_done("other", 2) and len(work.done_stats("other")) == 1


def test_a_forked_child_opens_its_own_filesystem(s3):
    work = WorkDir(f"{s3}/run", n_partitions=3).init()  # this process's s3fs and its event loop in use
    parent_fs = storage.filesystem(work.root)
    ctx = multiprocessing.get_context("fork")
    results = ctx.SimpleQueue()

    def child() -> None:
        fs = storage.filesystem(work.root)
        results.put((fs is not parent_fs, WorkDir(work.url).n_partitions, work.is_initialized()))

    proc = ctx.Process(target=child)
    proc.start()
    proc.join(60)
    if proc.exitcode is None:
        proc.kill()
    assert proc.exitcode == 0 and results.get() == (True, 3, True)


def test_forked_workers_write_the_same_parts_as_locally(s3, tmp_path):
    """LocalExecutor forks 2 workers after this process used S3 (its s3fs instance and event
    loop): each child opens its own, and the parts are byte for byte the local run's."""
    local = toy.make_input(tmp_path / "local")
    remote = toy.make_input(f"{s3}/run")
    assert copy.deepcopy(remote).url == remote.url  # rebuilt from its URL and count alone
    assert len(pickle.dumps(remote)) < 300  # a URL and a count: no filesystem travels
    ra = LocalExecutor(workers=2, show_progress=False).run(toy.ToyStage(), local)
    rb = LocalExecutor(workers=2, show_progress=False).run(toy.ToyStage(), remote.url)
    assert ra.ok and rb.ok and ra.done == rb.done == local.partitions("images")
    for table in ("images_ok", "rejected"):
        a = {p.name: p.read_bytes() for p in local.part_files(table)}
        b = {p.name: storage.read_bytes(p) for p in remote.part_files(table)}
        assert a and a == b, table
        sa = {p.name: p.read_bytes() for p in (local.root / table).glob("*.stats.json")}
        sb = {n: storage.read_bytes(remote.table_dir(table) / n) for n in sa}
        assert sa == sb
    again = LocalExecutor(workers=2, show_progress=False).run(toy.ToyStage(), remote)
    assert again.done == [] and again.skipped == rb.done


# -- the command line -------------------------------------------------------------------------
def test_cli_errors_are_messages_not_tracebacks(s3, capsys):
    assert lait(["filter", "s3://lait-no-such-bucket/run", "--no-progress"]) == 2
    assert "bucket not found (or not accessible): s3://lait-no-such-bucket" in capsys.readouterr().err
    assert lait(["clean", f"{s3}/nothing", "--no-progress"]) == 2
    assert f"work directory not found: {s3}/nothing" in capsys.readouterr().err
    storage.write_atomic(RemotePath(f"{s3}/half/pages/readme.txt"), b"not a work dir")
    for argv in (["score", f"{s3}/half"], ["build", f"{s3}/half"], ["stats", f"{s3}/half"], ["run", f"{s3}/half"]):
        assert lait(argv) == 2, argv
        assert f"not a lait work directory (no lait.json): {s3}/half" in capsys.readouterr().err
    assert lait(["crawl", "--seeds", "http://127.0.0.1:9/", "--out", "s3://lait-no-such-bucket/run"]) == 2
    assert "bucket not found" in capsys.readouterr().err
    assert lait(["demo", "--out", f"{s3}/demo"]) == 2
    assert "local folder" in capsys.readouterr().err


def test_missing_s3fs_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['s3fs'] = None\n"
            "from lait.app.cli import main; sys.exit(main(['filter', 's3://bucket/run', '--no-progress']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'lait[s3]'" in proc.stderr and "Traceback" not in proc.stderr


def test_ingest_warc_into_s3_equals_local(s3, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("warc_factory", HERE.parent / "crawler" / "warc" / "conftest.py")
    factory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(factory)
    files = [str(factory.write_site_warc(tmp_path / f"{n}.warc.gz", n_pages=n)) for n in (2, 3)]
    for out in (str(tmp_path / "local"), f"{s3}/warc"):
        # The archives only (their ex.test images cannot be fetched here; lait download's tests fetch)
        assert lait(["ingest-warc", *files, "--out", out, "--workers", "2", "--partitions", "3", "--no-progress",
                     "--no-fetch-images"]) == 0
    local, remote = WorkDir(tmp_path / "local"), WorkDir(f"{s3}/warc")
    assert remote.n_partitions == 3 and remote.count("pages") == 9  # pages, the 404 and the noai page of each
    for table in ("pages", "images", "warc_links", "rejected"):
        assert sorted(local.read(table).to_pylist(), key=repr) == sorted(remote.read(table).to_pylist(), key=repr)
    capsys.readouterr()
    assert lait(["ingest-warc", *files, "--out", f"{s3}/warc", "--no-progress", "--no-fetch-images"]) == 0
    assert capsys.readouterr().err.count("already ingested") == 2


def test_a_folder_published_to_s3_replaces_the_earlier_one_whole(s3, tmp_path):
    """`lait documents` on S3 makes its files locally, then puts them in place of the earlier
    set: the second set replaces the first whole (a file the new set lacks goes), nothing is
    left beside it."""
    from lait.build.documents import _publish

    out = storage.location(f"{s3}/work/documents")
    for n, names in enumerate((("00000.tar", "00001.tar", "stats.json"), ("00000.tar", "stats.json"))):
        local = tmp_path / f"set-{n}"
        local.mkdir()
        for name in names:
            (local / name).write_bytes(f"{name} of set {n}".encode())
        _publish(local, out)
        assert keys(s3) == [f"work/documents/{name}" for name in names]
        assert storage.read_bytes(out / "00000.tar") == f"00000.tar of set {n}".encode()


# -- acceptance: crawl into S3, then stages 2-5 on S3 equal to the same on a local copy ---------






def run_commands(commands: list[list[str]], capsys) -> None:
    for argv in commands:
        assert lait(argv) == 0, (argv, capsys.readouterr().err[-3000:])


@pytest.fixture(scope="module")
def crawled(aws):
    """The built-in web (30 articles) crawled straight into `s3://BUCKET/crawl`; left untouched
    by the tests, which copy it."""
    from lait.crawler.config import CrawlConfig
    from lait.crawler.run import crawl
    from lait.testkit.generator import generate_site
    from lait.testkit.server import SiteServer

    url = f"{new_bucket()}/crawl"
    with SiteServer(generate_site(30, seed=5)) as srv:
        stats = crawl(CrawlConfig(seeds=[srv.url + "/"], out=url, allow_loopback=True, autothrottle=False,
                                  n_partitions=4, part_rows=5, log_level="WARNING"), quiet=True)
    assert stats["finish_reason"] == "finished"
    return url


@pytest.fixture(scope="module")
def local_run(crawled, tmp_path_factory):
    """The crawl downloaded into a local folder, and stages 2-5 run there with 2 workers."""
    tmp = tmp_path_factory.mktemp("local-run")
    model = tmp / "tiny-clip.json"
    model.write_text(json.dumps(TINY_CLIP))
    local = tmp / "work"
    storage.filesystem(RemotePath(crawled)).get(crawled + "/", str(local), recursive=True)
    assert WorkDir(local).count("pages") == WorkDir(crawled).count("pages")
    for argv in stage_commands(str(local), model, ["--workers", "2", "--no-progress"]):
        assert lait(argv) == 0, argv
    return WorkDir(local), model


def copy_of(crawled: str, name: str) -> WorkDir:
    url = f"{RemotePath(crawled).parent}/{name}"
    storage.filesystem(RemotePath(crawled)).copy(crawled + "/", url + "/", recursive=True)
    return WorkDir(url)


@pytest.mark.slow
def test_crawl_into_s3_then_stages_2_to_5_equal_a_local_run(crawled, local_run, tmp_path, capsys):
    remote = WorkDir(crawled)
    assert remote.n_partitions == 4 and remote.count("pages") > 30 and remote.count("images") > 30
    assert len(remote.part_files("pages")) > 4  # rolling parts: several per partition
    assert not any("/.tmp-" in k for k in keys(str(remote.root.bucket)))

    local, model = local_run
    work = copy_of(crawled, "run")
    run_commands(stage_commands(work.url, model, ["--workers", "2", "--no-progress"]), capsys)
    a, b = tables(local), tables(work)
    assert all(a[t] for t in ("images_ok", "candidates", "scored", "regions", "region_labels", "build_plan"))
    for t in a:
        assert a[t] == b[t], t
    members = shard_members(local)
    assert any(n.endswith(".regions.npy") for n in members)
    assert members == shard_members(work)
    assert not any("/.tmp-" in k for k in keys(str(work.root.bucket)))

    capsys.readouterr()
    run_commands(stage_commands(work.url, model, ["--workers", "2", "--no-progress"])[3:], capsys)
    assert "build_shards: 0 done, 2 up to date" in capsys.readouterr().err  # a rerun redoes nothing
    assert lait(["stats", work.url, "--html", str(tmp_path / "report.html")]) == 0
    assert "samples in shards" in capsys.readouterr().out
    assert "data:image/jpeg;base64," in (tmp_path / "report.html").read_text()


DOCUMENTS = ["--min-sim", "-1", "--min-words", "20", "--face-model", "none"]
DOC_TABLES = ("doc_pages", "doc_sims")


def document_files(root: Location) -> dict[str, bytes]:
    """The documents' tars and Parquet files, by name."""
    return {p.name: storage.read_bytes(p) for p in storage.list_dir(root / "documents")
            if p.name.endswith((".tar", ".parquet"))}


@pytest.mark.slow
def test_stages_2_to_5_and_documents_on_ray_over_s3_equal_the_local_run(crawled, local_run, tmp_path, capsys,
                                                                         ray_temp_dir):
    """Stages 2 to 5 on a local Ray cluster over S3 (issue 8) give the local executor's tables
    and shards on a local disk, and so do the two table passes of `lait documents` (issue 63)
    and the documents they lead to. (Ray on a local disk: test_ray_executor, test_warc_ray.)"""
    import shutil

    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    local, model = local_run
    docs_local = WorkDir(tmp_path / "docs-local")
    shutil.copytree(local.root, docs_local.root)
    # A tiny random scorer's cosines say nothing: every picture stays (min_sim -1).
    run_commands([["documents", str(docs_local.root), *DOCUMENTS, "--workers", "2", "--no-progress"]], capsys)
    work = copy_of(crawled, "ray")
    # Ray's workers start from this process's environment: the AWS variables reach them.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_temp_dir)
    try:
        on_ray = ["--executor", "ray", "--workers", "2", "--no-progress"]
        run_commands([*stage_commands(work.url, model, on_ray), ["documents", work.url, *DOCUMENTS, *on_ray]],
                     capsys)
    finally:
        ray.shutdown()
    a, b = tables(docs_local), tables(work)  # `rejected` with the documents' rejects
    for t in a:
        assert a[t] == b[t], t
    assert shard_members(local) == shard_members(work)
    for t in DOC_TABLES:
        rows = sorted(docs_local.read(t).to_pylist(), key=repr)
        assert rows and rows == sorted(work.read(t).to_pylist(), key=repr), t
    docs = document_files(docs_local.root)
    assert any(name.endswith(".tar") for name in docs)
    assert docs == document_files(work.root)
