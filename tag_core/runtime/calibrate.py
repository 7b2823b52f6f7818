"""`tag calibrate`: measure a TF runtime and fit the cost terms of tag_core.cluster.calibration.

On a local cluster (`calibrate_local`: N pinned single-core servers on 127.0.0.1, described as N
one-device machines) or on a real one (`calibrate_cluster`: the servers of a cluster.json, task 0 started
here). A child process (tag_core.runtime.calibration_client) runs the steps of
tag_core.runtime.calibration_graphs in a graph-mode session on task 0, as `tag run` does: point-to-point
transfers per link class at every size, the collectives the emitter uses per group size, and the
executor's fixed costs. Every step runs under a deadline (RunOptions and the collectives' own
timeout); a step that outlives it anyway (gRPC retries a call to a dead server for minutes) ends with
the child, which this process kills, before the servers are stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from tag_core import __version__, tf_children
from tag_core.cluster.calibration import Calibration, FitRefused, Sample, fit_calibration
from tag_core.cluster.gpu_catalog import lookup_gpu
from tag_core.cluster.topology import Machine, Topology

from .local_cluster import child_env, local_cluster, task_servers
from .run_result import one_line_tail

KB, MB = 2**10, 2**20
DEFAULT_SIZES = (4 * KB, 64 * KB, 1 * MB, 16 * MB, 64 * MB)
HANG_GRACE_S = 15.0  # past a step's own deadline before its process is killed
STARTUP_S = 120.0  # the client's TensorFlow import, and every task answering
_CODE_FILES = ("cluster/calibration.py", "cluster/calibration_json.py", "runtime/calibrate.py",
               "runtime/calibration_client.py", "runtime/calibration_graphs.py", "runtime/local_cluster.py")


class CalibrationError(RuntimeError):
    """A measurement that failed or hung, or samples that determine no fit (one line)."""


@dataclass(frozen=True)
class CalibrationSettings:
    sizes: tuple[int, ...] = DEFAULT_SIZES  # payload bytes (multiples of 4: float32 elements)
    repeats: int = 7  # timed runs per series, after the warm-up
    warmup: int = 2  # untimed runs per series (the first also registers the step's graph on every task)
    group_sizes: tuple[int, ...] | None = None  # collective group sizes (default: 2, powers of two, all)
    chain_ops: int = 1000  # ops in the per-op chain
    transfer_hops: int = 32  # tiny send/recv pairs chained for the per-transfer cost
    step_timeout_s: float = 60.0  # one step's deadline


def code_version() -> str:
    digest = hashlib.sha256()
    here = Path(__file__).parents[1]  # tag_core
    for name in _CODE_FILES:
        digest.update((here / name).read_bytes())
    return f"{__version__}+{digest.hexdigest()[:12]}"


# ---------------------------------------------------------------- the measuring child


def measure(target_args: list[str], tasks: int, settings: CalibrationSettings, progress: bool = True,
            startup_s: float = STARTUP_S, grace_s: float = HANG_GRACE_S,
            on_event: Callable[[dict], None] | None = None) -> list[Sample]:
    """Every sample of a cluster of `tasks` that `target_args` reach (`LocalCluster.client_args`, or
    ["--target", "grpc://host:port" of task 0]), measured by a child process that is killed when a step outlives its deadline. `on_event` sees every event the
    child reports (tag_core.runtime.calibration_client), for callers that show progress their own way."""
    from tqdm import tqdm

    command = [sys.executable, "-m", "tag_core.runtime.calibration_client", *target_args, "--tasks",
               str(tasks), "--settings", json.dumps(asdict(settings)), "--wait", str(startup_s)]
    child = tf_children.popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=child_env(threads=None), start_new_session=True)
    events: queue.Queue = queue.Queue()
    stderr_tail: deque = deque(maxlen=40)
    threading.Thread(target=_pump, args=(child.stdout, events.put), daemon=True).start()
    threading.Thread(target=_pump, args=(child.stderr, stderr_tail.append), daemon=True).start()
    samples: list[Sample] = []
    label, allowed = "starting the measuring session", startup_s + grace_s
    deadline = time.monotonic() + allowed
    bar = tqdm(desc="calibrate", unit="round", file=sys.stderr, disable=not progress, leave=False)
    try:
        while True:
            try:
                line = events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise CalibrationError(f"{label}: no answer within {allowed:g} s; the measurement was "
                                       "stopped") from None
            if line is None:  # the child closed its output
                raise CalibrationError(f"the measuring process ended without finishing: {one_line_tail(stderr_tail)}")
            event = _parse(line)
            if event is None:
                continue
            if on_event is not None:
                on_event(event)
            kind = event["event"]
            if kind == "step":
                label, allowed = event["label"], settings.step_timeout_s + grace_s
                deadline = time.monotonic() + allowed
            elif kind == "series":
                bar.set_postfix_str(f"warming up {event['total']} series")
            elif kind == "round":
                bar.total = event["total"]
                bar.n = event["index"]
                bar.set_postfix_str("every series once")
                bar.refresh()
            elif kind == "retry":
                bar.set_postfix_str(f"{event['label']} (again: load hid it)")
            elif kind == "samples":
                samples += [Sample(**row) for row in event["rows"]]
            elif kind == "error":
                raise CalibrationError(event["message"])
            elif kind == "done":
                return samples
    finally:
        bar.close()
        _end(child)


def _pump(stream, put) -> None:
    for line in stream:
        put(line.rstrip("\n"))
    put(None)


def _parse(line: str) -> dict | None:
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def _end(child: subprocess.Popen, wait_s: float = 10.0) -> None:
    """Let a child that reported "done" exit; kill it (and its process group) otherwise or after `wait_s`."""
    try:
        child.wait(timeout=wait_s if child.poll() is None else 0)
    except subprocess.TimeoutExpired:
        pass
    if child.poll() is None:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()


# ---------------------------------------------------------------- local and real clusters


def local_topology(name: str, tasks: int, gbps: float) -> Topology:
    """This machine as `tasks` one-device machines task0.. of GPU type "cpu" joined at `gbps`."""
    figure = float(f"{gbps:.4g}")
    cpu = lookup_gpu("cpu", "gpu")
    # One device per machine: intra_gbps carries no traffic; the link figure stands in for it.
    machines = tuple(Machine(name=f"task{k}", gpu=cpu, count=1, intra_gbps=figure) for k in range(tasks))
    return Topology(name=name, machines=machines, inter_gbps=figure)


def fit_samples(samples: list[Sample], topology: str, topology_hash: str, source: str) -> Calibration:
    """The calibration these samples give, stamped with this host and code (CalibrationError if they give none)."""
    try:
        return fit_calibration(samples, topology=topology, topology_hash=topology_hash, source=source,
                               host=socket.gethostname(), code_version=code_version())
    except FitRefused as exc:
        raise CalibrationError(str(exc)) from None


def calibrate_local(tasks: int, settings: CalibrationSettings, name: str | None = None,
                    progress: bool = True) -> tuple[Calibration, Topology]:
    """Measure `tasks` pinned local servers; the topology they form (its inter_gbps from the fit) and
    its calibration."""
    with local_cluster(tasks, where="--local") as cluster:
        samples = measure(cluster.client_args(), tasks, settings, progress=progress)
    name = name or f"local-{tasks}"
    fitted = fit_samples(samples, name, "", "local")  # the topology takes its bandwidth from the fit, then its hash
    topology = local_topology(name, tasks, fitted.links["inter"].gbps)
    return replace(fitted, topology_hash=topology.content_hash()), topology


def calibrate_cluster(topology: Topology, cluster: dict[str, list[str]], settings: CalibrationSettings,
                      progress: bool = True) -> Calibration:
    """Measure a real cluster whose tasks 1.. serve (`tag calibrate --cluster ... --task-index K`); task 0
    is served from here, with TensorFlow's default threads."""
    with task_servers(cluster, [0], devices_per_task=topology.machines[0].count, threads=None) as servers:
        samples = measure(["--target", f"grpc://{servers[0].address}"], topology.num_machines, settings, progress=progress)
    return fit_samples(samples, topology.name, topology.content_hash(), "cluster")
