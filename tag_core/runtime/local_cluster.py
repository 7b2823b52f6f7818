"""TF servers in processes of their own: a local cluster of pinned single-core tasks, or some tasks of a
real cluster.

`local_cluster(n)` starts n `tf.distribute.Server`s on 127.0.0.1, each in its own process, pinned to
its own core (os.sched_setaffinity) and running with one intra-op and one inter-op thread, so that
n devices really compute in parallel: logical devices that share a task share its threads and the
machine's cores. It yields the cluster (addresses, the `{"worker": [...]}` cluster spec, process ids)
and stops every process on exit, error or interrupt; each server also exits by itself when the
process that started it is gone. `task_servers` starts chosen tasks of any cluster spec the same way.

The session's master does not run in task 0: the cluster spec also names a "client" job, which the
client process serves itself (`session_target`), unpinned. A master in task 0 shares that task's one
core with its compute, so it dispatched the other tasks' shares of a step late (measured on a duplicated
mlp under load: 24.5 ms a step against 13.9 ms with the master in the client).

TensorFlow's gRPC server listens on every interface ("0.0.0.0:port", hard-coded in TF's
grpc_server_lib), whatever the cluster spec names. So `local_cluster` starts its servers in a network
namespace of their own in which only `lo` is up (tag_core.runtime.loopback), held while the context is
open: every child started with `child_env` inside it (the servers, and the client the caller starts)
joins it, and nothing outside the machine's loopback of that namespace can reach the ports. Without
namespaces it refuses, or warns, as TAG_NETNS says. `task_servers` alone (a real cluster's tasks) uses
none: those must be reachable from the other machines.

Run as `python -m tag_core.runtime.local_cluster --cluster JSON --task-index K [--core C]` it serves
one task: it prints {"event": "serving", ...} on stdout once the server is up, then serves until stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from tag_core import tf_children
from tag_core.errors import TagInputError

from .loopback import Namespace, NamespaceRefused, child_environment, loopback_namespace
from .parent_watch import exit_with_parent as watch_parent
from .run_result import one_line_tail

LEADER = "/job:worker/replica:0/task:0"  # collectives need one task to resolve their groups
STARTUP_S = 120.0  # importing TensorFlow in several processes at once on a small machine
STOP_GRACE_S = 5.0


class ServerStartError(RuntimeError):
    """A server process that exited or hung before serving (one line, with the end of its stderr)."""


@dataclass(frozen=True)
class ServerProcess:
    task: int
    address: str
    pid: int
    core: int | None  # the core it is pinned to, or None
    # The process and the end of its stderr, read on: how it ended, should it die (tag_core.runtime.server_death).
    process: subprocess.Popen | None = field(default=None, compare=False, repr=False)
    stderr: deque | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class LocalCluster:
    servers: tuple[ServerProcess, ...]
    isolated: bool = False  # in a network namespace of their own, with only lo up
    client: str | None = None  # the address the client's own server (the session's master) takes

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.servers]

    @property
    def cluster_spec(self) -> dict[str, list[str]]:
        """As tf.train.ClusterSpec takes it, and as cluster.json's "cluster" holds it."""
        return {"worker": self.addresses}

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.servers]

    def target(self, task: int = 0) -> str:
        """The gRPC target of a task's own server (task 0 leads the collectives)."""
        return f"grpc://{self.servers[task].address}"

    @property
    def client_cluster(self) -> str | None:
        """The cluster spec (JSON) the client serves its "client" job in (`session_target`)."""
        return json.dumps({**self.cluster_spec, "client": [self.client]}) if self.client else None

    def client_args(self) -> list[str]:
        """What a client child takes (see `add_target_arguments`) to reach the cluster through its own master."""
        args = ["--target", self.target(0)]
        return args + ["--client-cluster", self.client_cluster] if self.client else args


def add_target_arguments(parser, required: bool = True) -> None:
    parser.add_argument("--target", required=required, help="grpc://host:port of task 0")
    parser.add_argument("--client-cluster", help='JSON cluster spec with a "client" job: serve it here and make '
                                                 "the session's master this process's (see LocalCluster.client_args)")


_CLIENT_SERVERS: dict[str, object] = {}  # kept alive for the process: sessions use them until it exits


def session_target(target: str, client_cluster: str | None) -> str:
    """The target a client's session opens: its own "client" server when the cluster names one, else task 0."""
    if not client_cluster:
        return target
    if client_cluster not in _CLIENT_SERVERS:
        import tensorflow as tf

        spec = tf.train.ClusterSpec(json.loads(client_cluster))
        _CLIENT_SERVERS[client_cluster] = tf.distribute.Server(spec, job_name="client", task_index=0,
                                                               config=server_config(threads=None), start=True)
    return _CLIENT_SERVERS[client_cluster].target


def pinnable_cores() -> list[int]:
    """The cores this process may run on (a container or taskset may allow fewer than the machine has)."""
    return sorted(os.sched_getaffinity(0))


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def local_cluster(tasks: int, devices_per_task: int = 1, startup_s: float = STARTUP_S,
                  where: str = "tasks") -> Iterator[LocalCluster]:
    """`tasks` pinned single-core TF servers on 127.0.0.1; every process is gone when this exits."""
    cores = pinnable_cores()
    if tasks < 1:
        raise TagInputError(where, f"must be at least 1, got {tasks}")
    if tasks > len(cores):
        raise TagInputError(where, f"{tasks} tasks need {tasks} cores to run in parallel; this process may "
                                   f"use {len(cores)} ({', '.join(map(str, cores))})")
    addresses = [f"127.0.0.1:{free_loopback_port()}" for _ in range(tasks)]
    client = f"127.0.0.1:{free_loopback_port()}"
    with _loopback_only() as namespace, \
            task_servers({"worker": addresses, "client": [client]}, range(tasks),
                         cores=[cores[k % len(cores)] for k in range(tasks)], devices_per_task=devices_per_task,
                         startup_s=startup_s) as servers:
        yield LocalCluster(tuple(servers), isolated=namespace is not None, client=client)


@contextmanager
def _loopback_only() -> Iterator[Namespace | None]:
    """The local run's network namespace (None where TAG_NETNS lets it go without); ServerStartError when
    none can be made and TAG_NETNS requires one."""
    try:
        with loopback_namespace() as namespace:
            yield namespace
    except NamespaceRefused as exc:
        raise ServerStartError(str(exc)) from None


@contextmanager
def task_servers(cluster: dict[str, list[str]], tasks: Sequence[int], cores: Sequence[int | None] | None = None,
                 devices_per_task: int = 1, threads: int | None = 1,
                 startup_s: float = STARTUP_S) -> Iterator[list[ServerProcess]]:
    """Serve `tasks` of `cluster` ({"worker": ["host:port", ...]}), one process each (pinned to `cores`
    when given; `threads` per pool, None for TF's default); every process started is stopped when this
    exits."""
    tasks = list(tasks)
    cores = list(cores) if cores is not None else [None] * len(tasks)
    children: list[subprocess.Popen] = []
    try:
        for task, core in zip(tasks, cores):
            command = [sys.executable, "-m", "tag_core.runtime.local_cluster", "--cluster", json.dumps(cluster),
                       "--task-index", str(task), "--devices", str(devices_per_task), "--threads", str(threads or 0)]
            if core is not None:
                command += ["--core", str(core)]
            children.append(tf_children.popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                             env=child_env(threads), start_new_session=True))
        servers = _wait_until_serving(children, tasks, cluster, cores, time.monotonic() + startup_s)
        yield servers
    finally:
        stop(children)


def child_env(threads: int | None) -> dict[str, str]:
    """The environment of a TF child process of this package (`threads`: per pool, None for TF's default)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
           # These children never use Keras: TF skips its eager Keras import when told to use the absent tf_keras.
           "TF_USE_LEGACY_KERAS": "1",
           **child_environment()}  # inside `local_cluster`: its namespace, joined at import
    if threads:  # the same count for every pool that reads these (OpenMP, oneDNN, TF's own defaults)
        env.update({"OMP_NUM_THREADS": str(threads), "TF_NUM_INTRAOP_THREADS": str(threads),
                    "TF_NUM_INTEROP_THREADS": str(threads)})
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds tag_core
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def _wait_until_serving(children: list[subprocess.Popen], tasks: list[int], cluster: dict, cores: list,
                        deadline: float) -> list[ServerProcess]:
    stderr_tails = [deque(maxlen=40) for _ in children]
    ready: dict[int, threading.Event] = {i: threading.Event() for i in range(len(children))}
    for i, child in enumerate(children):
        threading.Thread(target=_pump, args=(child, ready[i], stderr_tails[i]), daemon=True).start()
    for i, child in enumerate(children):
        while not ready[i].wait(timeout=0.2):
            if child.poll() is not None:
                raise ServerStartError(f"the server of task {tasks[i]} exited with code {child.returncode} before "
                                   f"serving: {one_line_tail(stderr_tails[i], last=3, limit=800)}")
            if time.monotonic() > deadline:
                raise ServerStartError(f"the server of task {tasks[i]} did not start serving in time")
    return [ServerProcess(task=t, address=cluster["worker"][t], pid=c.pid, core=core, process=c, stderr=tail)
            for t, c, core, tail in zip(tasks, children, cores, stderr_tails)]


def _pump(child: subprocess.Popen, ready: threading.Event, stderr_tail: deque) -> None:
    threading.Thread(target=lambda: [stderr_tail.append(line.rstrip()) for line in child.stderr],
                     daemon=True).start()
    for line in child.stdout:  # read to the end, so the child never blocks on a full pipe
        if line.startswith('{"event": "serving"'):
            ready.set()


def stop(children: list[subprocess.Popen]) -> None:
    """SIGTERM each process group, SIGKILL what is left after a grace period, and reap them all."""
    for child in children:
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for child in children:
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(child, signal.SIGKILL)
            child.wait()


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    if child.poll() is not None:
        return
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass


# ---------------------------------------------------------------- the server process


def server_config(devices: int | None = None, threads: int | None = 1):
    """The ConfigProto of a server (and of sessions on it): `threads` compute threads, the collective leader.

    The inter-op pool has one thread more: with one, task 0's executor runs its share of a step inline in the
    thread that would then dispatch the other tasks' shares, and the tasks compute one after the other
    (measured: a duplicated small_cnn step on two pinned tasks 57 ms, 37 ms with two; one device 21 ms
    either way; more threads help no further and slow the one-device step).
    """
    import tensorflow as tf

    from tag_core.profile.timing import pool_sizes

    config = tf.compat.v1.ConfigProto()
    if threads is not None:
        config.intra_op_parallelism_threads, config.inter_op_parallelism_threads = pool_sizes(threads)
    if devices is not None:
        config.device_count["CPU"] = devices
    config.experimental.collective_group_leader = LEADER
    return config


def serve(cluster: dict[str, list[str]], task: int, devices: int = 1, core: int | None = None,
          threads: int | None = 1, exit_with_parent: bool = True) -> None:
    """Serve one task until stopped (pinned to `core` first, so every thread TF starts stays on it)."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    if exit_with_parent:
        watch_parent()
    import tensorflow as tf

    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="worker", task_index=task,
                                  config=server_config(devices, threads), start=True)
    print(json.dumps({"event": "serving", "task": task, "target": server.target, "pid": os.getpid(), "core": core}),
          flush=True)
    server.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tag_core.runtime.local_cluster")
    parser.add_argument("--cluster", required=True, help='JSON: {"worker": ["host:port", ...]}')
    parser.add_argument("--task-index", type=int, required=True)
    parser.add_argument("--devices", type=int, default=1, help="logical CPU devices of the task")
    parser.add_argument("--core", type=int, help="pin the task to this core")
    parser.add_argument("--threads", type=int, default=1, help="intra- and inter-op threads (0: TF's default)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    serve(json.loads(args.cluster), args.task_index, args.devices, args.core, args.threads or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
