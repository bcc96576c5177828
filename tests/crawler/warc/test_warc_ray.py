"""`lait ingest-warc --executor ray`: one Ray task per archive file, the same tables as the local
process pool (issue 30)."""

from __future__ import annotations

import pytest

from lait.crawler.warc_ingest import ingest_files
from lait.workdir import WorkDir

ray = pytest.importorskip("ray", reason="the ray extra is not installed")


def test_ingest_on_ray_equals_the_local_pool(tmp_path, factory, ray_temp_dir):
    paths = [factory.write_site_warc(tmp_path / f"s{i}.warc.gz", n_pages=2 + i) for i in range(3)]
    bad = tmp_path / "junk.warc.gz"
    bad.write_bytes(b"\x1f\x8b not really gzip")
    local = ingest_files([*paths, bad], tmp_path / "w1", workers=2, show_progress=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_temp_dir)
    try:
        on_ray = ingest_files([*paths, bad], tmp_path / "w2", show_progress=False, executor="ray")
    finally:
        ray.shutdown()
    assert [r.path for r in on_ray] == [r.path for r in local]
    assert [(r.pages, r.images, r.links, r.rejected, len(r.damage)) for r in on_ray] == \
           [(r.pages, r.images, r.links, r.rejected, len(r.damage)) for r in local]
    assert on_ray[-1].damage and not any(r.failed for r in on_ray)
    w1, w2 = WorkDir(tmp_path / "w1"), WorkDir(tmp_path / "w2")
    for t in ("pages", "images", "warc_links", "rejected"):
        rows = sorted(map(str, w1.read(t).to_pylist()))
        assert rows and rows == sorted(map(str, w2.read(t).to_pylist())), t
    # Each file wrote its completion marker from its task: a rerun skips them all.
    again = ingest_files([*paths, bad], tmp_path / "w2", workers=1, show_progress=False)
    assert all(r.skipped for r in again[:-1])
