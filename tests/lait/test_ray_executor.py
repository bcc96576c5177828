"""The Ray executor on a real local Ray cluster (2 CPUs), against the local executor's output."""

from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed")
import cloudpickle  # noqa: E402  (ships with ray)

from lait.executor import LocalExecutor  # noqa: E402
from lait.ray_executor import RayExecutor  # noqa: E402
from lait.testkit import toy_stage as toy  # noqa: E402

# Ray workers cannot import a test module by name: ship its code with the task.
cloudpickle.register_pickle_by_value(toy)


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
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_temp_dir)
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
