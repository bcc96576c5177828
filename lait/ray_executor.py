"""RayExecutor: the same `run_part` as the local executor, as Ray tasks on a cluster.

Past one machine, partitions become Ray tasks; the work directory must be reachable from every
node: a shared filesystem, or object storage (`s3://...`, see `lait.storage`). Workers of a
local Ray started here inherit this process's environment (AWS variables,
`LAIT_STORAGE_OPTIONS`); on a cluster, the nodes need them too (instance roles, or the job's
runtime env: `ray job submit --runtime-env-json '{"env_vars": {...}}' -- lait ...`). Ray retries a task whose worker died (`max_retries`) and, here, one
that raised (`retry_exceptions`); a partition that still fails is reported by number while the
others complete. At most `max_in_flight` tasks are submitted at once, so the object store and
the scheduler hold a bounded amount whatever the number of partitions.

Stages that declare `num_gpus > 0` (scoring) run on GPU actors when the cluster has GPUs:
one actor per GPU, each keeping its loaded model between partitions.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence
from typing import Any

from lait import errors
from lait.log import progress
from lait.memory import arrow_env
from lait.stage import RunReport, Stage, merge_before, run_part, start_report
from lait.workdir import WorkDir

log = logging.getLogger(__name__)


def _worker_env() -> dict[str, Any]:
    """Ray starts its workers itself, so they get lait's Arrow pool through their runtime
    environment (merged with the job's): pyarrow reads it when it loads (see lait.memory)."""
    return {"env_vars": arrow_env()}


# A Ray that lait starts for itself (`--executor ray` without `--ray-address`) is one node that
# nothing joins. Ray's switch for such a Ray (the one it uses on macOS and Windows, where it
# supports no cluster) makes it take the loopback address as its own and bind every server to
# it, instead of finding the machine's address by a route towards 8.8.8.8 and listening on every
# interface. It is read when ray is imported, so it is set before. A cluster of several nodes
# (`ray start`, --ray-address) cannot have it: Ray then binds its GCS and raylets to every
# interface whatever --node-ip-address says (docs/scaling.md).
SINGLE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def single_node_env() -> None:
    """Set Ray's single-node switch for a Ray started here (unless the user set it), before ray
    is imported; a ray imported earlier keeps what it read, said in one log line."""
    import os
    import sys

    if "ray" in sys.modules and os.environ.get(SINGLE_NODE_ENV) != "0":
        log.info("ray was imported before lait started its own Ray: it listens as Ray decides")
        return
    os.environ.setdefault(SINGLE_NODE_ENV, "0")


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError("the Ray executor needs Ray: pip install 'lait[ray]'") from None
    return ray


class RayExecutor:
    """Runs partitions as Ray tasks (CPU) or on GPU actors (stages with `num_gpus`)."""

    def __init__(self, address: str | None = None, retries: int = 2, *, workers: int | None = None,
                 show_progress: bool = True, max_in_flight: int | None = None,
                 init_kwargs: dict[str, Any] | None = None, force: bool = False):
        self.address = address
        self.force = force
        self.retries = retries
        self.workers = workers
        self.show_progress = show_progress
        self.max_in_flight = max_in_flight
        self.init_kwargs = dict(init_kwargs or {})

    def _connect(self) -> Any:
        if not self.address:
            single_node_env()
        ray = _import_ray()
        if not ray.is_initialized():
            kwargs = {"include_dashboard": False, "log_to_driver": True, **self.init_kwargs}
            if self.address:
                kwargs["address"] = self.address
            elif self.workers:
                kwargs.setdefault("num_cpus", self.workers)
            ray.init(**kwargs)
        return ray

    def run(self, stage: Stage, work: WorkDir | str, partitions: Sequence[int] | None = None) -> RunReport:
        ray = self._connect()
        work = work if isinstance(work, WorkDir) else WorkDir(work)
        work.clean_temp()
        before = [self.run(pre, work, partitions) for pre in stage.before()]
        report, plan = start_report(stage, work, partitions, force=self.force)
        merge_before(report, before)
        pending = plan.pending
        root = work.url
        submit = self._submitter(ray, stage)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        limit = self.max_in_flight or 2 * cpus
        bar = progress(total=len(pending), desc=stage.name, unit="part", disable=not self.show_progress)
        in_flight: dict[Any, int] = {}
        queue = list(pending)
        try:
            while queue or in_flight:
                while queue and len(in_flight) < limit:
                    p = queue.pop(0)
                    in_flight[submit(root, p, plan.fingerprints[p])] = p
                ready, _ = ray.wait(list(in_flight), num_returns=1)
                for ref in ready:
                    p = in_flight.pop(ref)
                    try:
                        stats = ray.get(ref)
                        report.done.append(p)
                        report.stats.append(stats)
                    except Exception as exc:  # retries are spent: report, keep going
                        stop = errors.stop_error(getattr(exc, "cause", None) or exc)
                        if stop is not None:  # a full disk: stop the run, retry nothing
                            for ref in in_flight:
                                ray.cancel(ref)
                            raise stop from exc
                        report.failed[p] = "".join(traceback.format_exception_only(type(exc), exc))
                    bar.update(1)
        finally:
            bar.close()
        return report.finish()

    def _submitter(self, ray: Any, stage: Stage) -> Any:
        num_gpus = float(getattr(stage, "num_gpus", 0) or 0)
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if num_gpus > 0 and gpus > 0:
            return self._gpu_actor_submitter(ray, stage, gpus)
        task = ray.remote(run_part).options(
            num_cpus=float(getattr(stage, "num_cpus", 1) or 1),
            max_retries=self.retries,
            retry_exceptions=True,
            runtime_env=_worker_env(),
        )
        stage_ref = ray.put(stage)
        return lambda root, p, fp: task.remote(stage_ref, root, p, fp)

    def _gpu_actor_submitter(self, ray: Any, stage: Stage, gpus: int) -> Any:
        @ray.remote(num_gpus=1, max_restarts=self.retries, max_task_retries=self.retries,
                    runtime_env=_worker_env())
        class PartRunner:
            """Holds a stage on one GPU; its model stays loaded between partitions."""

            def __init__(self, stage: Stage):
                self.stage = stage

            def run(self, root: str, partition: int, fingerprint: Any) -> dict[str, Any]:
                return run_part(self.stage, root, partition, fingerprint)

        actors = [PartRunner.remote(stage) for _ in range(gpus)]
        counter = iter(range(1 << 62))
        log.info("%s: %d GPU actors", stage.name, len(actors))
        return lambda root, p, fp: actors[next(counter) % len(actors)].run.remote(root, p, fp)


def ray_map(fn: Any, calls: Sequence[tuple], *, address: str | None = None, retries: int = 3,
            num_cpus: float = 1.0, max_in_flight: int | None = None,
            init_kwargs: dict[str, Any] | None = None) -> Any:
    """Run `fn(*args)` for each args of `calls` as a Ray task; yield (index, result) as they finish, with an
    exception object as the result of a task that failed.

    For units of work that are not partitions of a stage (stage 1's list shares and archive
    files). A task whose worker or node died is run again, up to `retries` times, on whatever
    node is alive; a task that raised is not (its error is the answer). At most
    `max_in_flight` tasks (default: twice the cluster's task slots) are submitted at once."""
    ray = RayExecutor(address=address, init_kwargs=init_kwargs)._connect()
    task = ray.remote(fn).options(num_cpus=num_cpus, max_retries=retries, retry_exceptions=False,
                                  runtime_env=_worker_env())
    slots = max(1, int(ray.cluster_resources().get("CPU", 1) // max(num_cpus, 1e-9)))
    limit = max_in_flight or 2 * slots
    queue = list(enumerate(calls))
    in_flight: dict[Any, int] = {}
    try:
        while queue or in_flight:
            while queue and len(in_flight) < limit:
                i, args = queue.pop(0)
                in_flight[task.remote(*args)] = i
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in ready:
                i = in_flight.pop(ref)
                try:
                    yield i, ray.get(ref)
                except Exception as exc:  # retries are spent, or the task raised
                    yield i, getattr(exc, "cause", None) or exc
    finally:
        for ref in in_flight:  # a stop (Ctrl-C) or an error in the caller: stop the rest
            ray.cancel(ref, force=True)


def ray_task_slots(address: str | None = None, num_cpus: float = 1.0,
                   init_kwargs: dict[str, Any] | None = None) -> int:
    """How many tasks of `num_cpus` CPUs the cluster runs at once (connecting if needed)."""
    ray = RayExecutor(address=address, init_kwargs=init_kwargs)._connect()
    return max(1, int(ray.cluster_resources().get("CPU", 1) // max(num_cpus, 1e-9)))
