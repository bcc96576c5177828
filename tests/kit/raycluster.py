"""A Ray cluster of separate nodes on this machine, for tests and benchmarks of work spread over
machines: a head that runs no tasks and worker nodes of a few CPUs each, every one started by
its own `ray start` process in its own process group, so one node can be killed whole (its
raylet, object store and workers) while the others go on, as when a machine of a cluster dies.

Ray's token authentication (on by default for `ray start --head` since Ray 2.5x) is kept on,
with a token of the cluster's own: written into its temporary folder and named by
`RAY_AUTH_TOKEN_PATH` (with `RAY_AUTH_MODE=token`, set in this process's environment while the
cluster runs), so that every node and the driver read it. `ray start --head` does not create a
missing token: on a fresh machine without ~/.ray/auth_token it failed.

Every node is started with `--node-ip-address 127.0.0.1`, but a Ray of several nodes still binds
its GCS and raylets to every interface: Ray has no setting against it where nodes join
(docs/scaling.md, "What a Ray listens on"); lait's own one-node Ray listens on loopback only.

    with LocalRayCluster(workers=2, cpus_per_worker=1) as cluster:
        ray.init(address=cluster.address)
        ...
        cluster.kill_worker(0)
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kit.processes import running, wait_until


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRayCluster:
    """`workers` worker nodes of `cpus_per_worker` CPUs beside a head with none."""

    def __init__(self, workers: int = 2, cpus_per_worker: int = 1, object_store_mb: int = 100):
        self.n_workers = workers
        self.cpus = cpus_per_worker
        self.object_store = object_store_mb << 20
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp_dir = tempfile.mkdtemp(prefix="lait-ray-cluster-")
        self.groups: list[int] = []  # process group of each node: the head's first
        self._saved_env: dict[str, str | None] = {}

    def _ray(self, *args: str) -> int:
        ray_cli = str(Path(sys.executable).with_name("ray"))
        # `ray start` daemonises its processes; the group it leads holds all of them.
        proc = subprocess.Popen([ray_cli, "start", *args, "--node-ip-address", "127.0.0.1",
                                 "--object-store-memory", str(self.object_store), "--disable-usage-stats"],
                                env=os.environ.copy(), start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start {' '.join(args)} failed:\n{out[-3000:]}")
        return proc.pid  # its process group id

    def start(self) -> LocalRayCluster:
        token = Path(self.temp_dir) / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        for key, value in {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                           "RAY_USAGE_STATS_ENABLED": "0"}.items():
            self._saved_env[key] = os.environ.get(key)
            os.environ[key] = value
        self.groups.append(self._ray("--head", "--port", str(self.port), "--num-cpus", "0",
                                     "--temp-dir", self.temp_dir, "--include-dashboard", "false"))
        for _ in range(self.n_workers):
            self.add_worker()
        return self

    def add_worker(self) -> None:
        self.groups.append(self._ray("--address", self.address, "--num-cpus", str(self.cpus)))

    def worker_pids(self, i: int) -> list[int]:
        """The processes of worker node `i` (0-based) that run now."""
        return _group_members(self.groups[1 + i])

    def kill_worker(self, i: int) -> None:
        """SIGKILL every process of worker node `i`, as when its machine dies."""
        _kill_group(self.groups[1 + i])

    def stop(self) -> None:
        for group in reversed(self.groups):
            _kill_group(group)
        self.groups.clear()
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalRayCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def _group_members(group: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and running(int(stat.parent.name)):
            out.append(int(stat.parent.name))
    return out


def _kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        return
    wait_until(lambda: not _group_members(group), 10.0)
    time.sleep(0.1)
