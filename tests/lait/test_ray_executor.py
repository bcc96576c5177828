"""The Ray executor on a real local Ray cluster (2 CPUs), against the local executor's output."""

from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed")
from kit import toy_stage as toy  # noqa: E402
from lait.executor import LocalExecutor  # noqa: E402
from lait.ray_executor import SINGLE_NODE_ENV, RayExecutor  # noqa: E402


class FailOnce(toy.ToyStage):
    """Fails the first attempt of one partition (a flaky node), succeeds when retried."""

    def __init__(self, partition: int):
        super().__init__()
        self.flaky = partition

    def process(self, ctx):
        flag = ctx.work.root / f"failed-once-{ctx.partition}"
        if ctx.partition == self.flaky and not flag.exists():
            flag.write_text("x")
            raise RuntimeError("transient failure")
        super().process(ctx)


@pytest.fixture(scope="module")
def ray_cluster(ray_temp_dir):
    # The job's workers import the test kit as pytest does (the tasks' own environment adds lait's).
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_temp_dir,
             runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}})
    yield
    ray.shutdown()


def outputs(root: Path) -> dict[str, bytes]:
    return {f"{t}/{p.name}": p.read_bytes() for t in ("images_ok", "rejected") for p in sorted((root / t).glob("*"))}


def test_ray_output_equals_local_and_a_failing_part_is_retried(tmp_path, ray_cluster):
    local = toy.make_input(tmp_path / "local")
    LocalExecutor(workers=1, show_progress=False).run(toy.ToyStage(), local)

    work = toy.make_input(tmp_path / "ray")
    flaky = work.partitions("images")[1]
    report = RayExecutor(retries=1, show_progress=False).run(FailOnce(flaky), work)
    assert report.ok, report.summary()
    assert (work.root / f"failed-once-{flaky}").exists()  # it did fail once
    assert report.done == work.partitions("images")
    assert outputs(work.root) == outputs(local.root)

    again = RayExecutor(show_progress=False).run(toy.ToyStage(), work)
    assert again.done == [] and again.skipped == report.done


def test_ray_reports_a_part_that_always_fails(tmp_path, ray_cluster):
    work = toy.make_input(tmp_path)
    bad = work.partitions("images")[0]
    report = RayExecutor(retries=1, show_progress=False).run(toy.ToyStage(fail_partition=bad), work)
    assert list(report.failed) == [bad] and "toy failure" in report.failed[bad]
    assert len(report.done) == len(work.partitions("images")) - 1


class PoolProbe(toy.ToyStage):
    """Records the Arrow pool a Ray worker allocates from, and whether the Parquet reader's own
    allocations went to mimalloc (which keeps what it has used; see lait.memory)."""

    def process(self, ctx):
        import os

        import pyarrow as pa

        super().process(ctx)
        used = pa.mimalloc_memory_pool().max_memory() if hasattr(pa, "mimalloc_memory_pool") else 0
        (ctx.work.root / f"pool-{ctx.partition}").write_text(
            f"{os.environ.get('ARROW_DEFAULT_MEMORY_POOL')} {pa.default_memory_pool().backend_name} {used}")


def test_ray_workers_allocate_from_the_system_pool(tmp_path, ray_cluster):
    work = toy.make_input(tmp_path)
    report = RayExecutor(show_progress=False).run(PoolProbe(), work)
    assert report.ok, report.summary()
    seen = {p.read_text() for p in tmp_path.glob("pool-*")}
    assert seen == {"system system 0"}



def test_a_ray_lait_starts_for_itself_listens_on_loopback_only(tmp_path, ray_temp_dir):
    """Issue 59: `--executor ray` without an address started a Ray that found the machine's
    address by a route towards 8.8.8.8 and listened on every interface. Lait's own Ray is one node
    that nothing joins: every socket its processes listen on is a loopback one. (A cluster of
    several nodes cannot be bound so: docs/scaling.md.)"""
    import os
    import subprocess
    import sys

    code = f"""
from lait.ray_executor import RayExecutor
ray = RayExecutor(workers=1, init_kwargs={{"_temp_dir": {ray_temp_dir!r}, "log_to_driver": False}})._connect()
import psutil  # the copy Ray ships (ray/thirdparty_files), on the path once ray is imported
ray.get(ray.remote(lambda: 1).remote())  # a worker running too
print(sorted({{n["NodeManagerAddress"] for n in ray.nodes()}}))
mine = {{p.pid for p in psutil.Process().children(recursive=True)}}
for c in psutil.net_connections("inet"):
    if c.status == psutil.CONN_LISTEN and c.pid in mine:  # this session's GCS, raylet, workers
        print("listen", psutil.Process(c.pid).name(), c.laddr.ip)
ray.shutdown()
"""
    env = {k: v for k, v in os.environ.items() if k != SINGLE_NODE_ENV}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert "['127.0.0.1']" in lines
    listening = [line.split() for line in lines if line.startswith("listen ")]
    assert {name for _, name, _ in listening} >= {"gcs_server", "raylet"}, lines
    assert all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for _, _, ip in listening), listening
