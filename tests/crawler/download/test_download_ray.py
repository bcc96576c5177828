"""Stage 1 past one machine (issue 30): the units of work `lait download` fetches in, and a run on
a Ray cluster of separate nodes that loses one of them half way."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from lait.config import ConfigError
from lait.crawler.config import ImageFetchConfig, host_share
from lait.crawler.units import N_BUCKETS, pending_by_bucket, plan_units, unit_configs

REPO = Path(__file__).resolve().parents[3]


def test_plan_units_balances_buckets_and_gives_each_to_one_unit():
    counts = Counter({0: 900, 1: 500, 2: 400, 3: 300, 4: 300, 5: 200, 6: 100, 7: 100})
    units = plan_units(counts, 3)
    flat = [b for u in units for b in u]
    assert sorted(flat) == sorted(counts)  # every bucket, once
    loads = sorted(sum(counts[b] for b in u) for u in units)
    assert loads == [900, 900, 1000]  # largest first into the lightest: within one bucket of even
    # Hash-modulo shares of the same buckets would put 0, 3 and 6 (1300 images) into one unit.
    assert plan_units(counts, 20) == [[b] for b in sorted(counts, key=lambda b: (-counts[b], b))]
    assert plan_units(Counter(), 4) == []


def test_a_share_of_several_buckets_owns_exactly_their_hosts():
    urls = [f"http://h{i}.example/{j}.jpg" for i in range(40) for j in range(3)]
    units = plan_units(Counter(host_share(u, N_BUCKETS) for u in urls), 3)
    cfgs = unit_configs(ImageFetchConfig(out="w", concurrency=10), units, split_concurrency=True)
    owners = {u: [i for i, c in enumerate(cfgs) if c.owns(u)] for u in urls}
    assert all(len(o) == 1 for o in owners.values())
    by_host: dict[str, set[int]] = {}
    for u, (i,) in owners.items():
        by_host.setdefault(u.split("/")[2], set()).add(i)
    assert all(len(s) == 1 for s in by_host.values())  # a host belongs to one unit
    assert {c.concurrency for c in cfgs} == {4}  # side by side on one machine: split
    ray_cfgs = unit_configs(ImageFetchConfig(out="w", concurrency=10), units, split_concurrency=False)
    assert {c.concurrency for c in ray_cfgs} == {10}  # one Ray task each: per task
    for bad in ([1], [3, 3], [2, 5, 4], [-1, 2]):
        with pytest.raises(ConfigError, match="share"):
            ImageFetchConfig(out="w", share=bad).validate()


def test_pending_by_bucket_leaves_out_what_is_done(tmp_path):
    from datetime import datetime, timezone

    from lait.parts import PartitionedWriter
    from lait.workdir import WorkDir

    work = WorkDir(tmp_path / "w", n_partitions=2).init()
    urls = [f"http://h{i % 5}.example/{i}.jpg" for i in range(20)]
    with PartitionedWriter(work, "t") as out:
        for i, u in enumerate(urls):
            out.write("url_list", out.partition_of(u), {"image_url": u, "caption": "c", "list_file": "l",
                                                         "row": i + 1})
        for u in urls[:6]:
            out.write("images", out.partition_of(u), {"image_url": u, "bytes": b"x", "status": 200,
                                                       "fetched_at": datetime.now(timezone.utc)})
        out.reject("crawl/robots", out.partition_of(urls[6]), image_url=urls[6])
        out.reject("download/duplicate_url", out.partition_of(urls[7]), image_url=urls[7])
    counts = pending_by_bucket(work, ["url_list"])
    # Done: an images/ row or a crawl/ reject; a download/ reject of a row says nothing of its URL.
    assert counts == Counter(host_share(u, N_BUCKETS) for u in urls[7:])


# -- a cluster of separate nodes --------------------------------------------------------------

ray = pytest.importorskip("ray", reason="the ray extra is not installed")


def _download(list_path: Path, work: Path, names: list[str], *, executor: str, address: str | None = None):
    cmd = [sys.executable, "-m", "lait", "download", str(list_path), "--out", str(work), "--concurrency", "8",
           "--per-domain", "8", "--no-autothrottle", "--allow-loopback", "--no-progress", "--log-level",
           "WARNING", "--executor", executor, "--processes", "2",
           "--resolve", *[f"{h}:*:127.0.0.1" for h in names]]
    if address:
        cmd += ["--ray-address", address]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_download_on_a_cluster_that_loses_a_node_ends_with_every_url_once(tmp_path):
    """Two worker nodes (one fetcher task each) and a head, each its own `ray start`; worker node
    0 is killed whole once a quarter of the images were served: its task runs again on node 1,
    the command exits 0, and images/ holds every URL exactly once, equal as a set to a local
    run's."""
    sys.path.insert(0, str(REPO / "bench" / "download"))
    from ray_scale import host_names, image_rows, make_site, write_list

    from kit.photos import PhotoServer
    from kit.processes import wait_until
    from kit.raycluster import LocalRayCluster

    n = 480
    site, rows, names = make_site(n, 16, latency=0.25)
    assert names == host_names(16)
    with PhotoServer(site) as server, LocalRayCluster(workers=2, cpus_per_worker=1) as cluster:
        list_path = tmp_path / "list.csv"
        write_list(rows, server.port, list_path)
        work = tmp_path / "ray"
        proc = _download(list_path, work, names, executor="ray", address=cluster.address)
        killed = threading.Event()

        def kill_when_a_quarter_is_served():
            if wait_until(lambda: len(site.hits) >= n // 4 or proc.poll() is not None, 120):
                if proc.poll() is None:
                    cluster.kill_worker(0)
                    killed.set()

        killer = threading.Thread(target=kill_when_a_quarter_is_served)
        killer.start()
        out, _ = proc.communicate(timeout=300)
        killer.join()
        assert proc.returncode == 0, out[-3000:]
        assert killed.is_set(), "the run ended before a node could be killed"
        assert not cluster.worker_pids(0)
        ray_rows = image_rows(work)  # raises when a URL has two rows
        assert len(ray_rows) == n and {r[2] for r in ray_rows} == {200}
        served = Counter(h.split("?")[0] for h in site.hits if h.startswith("/p/"))
        assert set(served) == {f"/p/{i:06d}.jpg" for i in range(n)}
        hits_before_local = len(site.hits)
        local = tmp_path / "local"
        out, _ = _download(list_path, local, names, executor="local").communicate(timeout=300)
        assert image_rows(local) == ray_rows, out[-2000:]
        assert len(site.hits) > hits_before_local
    time.sleep(0)
