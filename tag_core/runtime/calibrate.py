"""`tag calibrate`: measure a TF runtime and fit the cost terms of tag_core.cluster.calibration.

On a local cluster (`calibrate_local`: N pinned single-core servers on 127.0.0.1, described as N
one-device machines) or on a real one (`calibrate_cluster`: the servers of a cluster.json, task 0 started
here). A session on task 0 runs the steps of tag_core.runtime.calibration_graphs in graph mode, as
`tag run` does: point-to-point transfers per link class at every size, the collectives the emitter
uses per group size, and the executor's fixed costs. Every step runs under a deadline (RunOptions and
the collectives' own timeout); a step that outlives it anyway stops the local servers, which ends it.
"""

from __future__ import annotations

import hashlib
import math
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median
from typing import Callable

from tag_core import __version__
from tag_core.cluster.calibration import Calibration, FitRefused, Sample, fit_calibration
from tag_core.cluster.gpu_catalog import lookup_gpu
from tag_core.cluster.topology import Machine, Topology

from .calibration_graphs import CalibrationGraph, Series, session_config
from .local_cluster import local_cluster, task_servers

KB, MB = 2**10, 2**20
DEFAULT_SIZES = (4 * KB, 64 * KB, 1 * MB, 16 * MB, 64 * MB)
HANG_GRACE_S = 15.0  # past the step's own deadline before the watchdog stops the servers
_CODE_FILES = ("cluster/calibration.py", "cluster/calibration_json.py", "runtime/calibrate.py",
               "runtime/calibration_graphs.py", "runtime/local_cluster.py")


class CalibrationError(RuntimeError):
    """A measurement that failed or hung, or samples that determine no fit (one line)."""


@dataclass(frozen=True)
class CalibrationSettings:
    sizes: tuple[int, ...] = DEFAULT_SIZES  # payload bytes (multiples of 4: float32 elements)
    repeats: int = 5  # timed runs per series, after the warm-up
    warmup: int = 1  # untimed runs per series (the first also registers the step's graph on every task)
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


def default_group_sizes(members: int) -> list[int]:
    sizes = {members} | {2**k for k in range(1, members.bit_length()) if 2**k <= members}
    return sorted(s for s in sizes if s >= 2)


# ---------------------------------------------------------------- what to measure


def build_series(graph: CalibrationGraph, tasks: list[list[str]], settings: CalibrationSettings) -> None:
    """Every series for a cluster whose task k has the devices tasks[k]."""
    inter = [t[0] for t in tasks]
    intra = next((t for t in tasks if len(t) >= 2), None)
    pairs = ([("inter", inter[0], inter[1])] if len(inter) >= 2 else []) + \
            ([("intra", intra[0], intra[1])] if intra else [])
    groups = [("inter", tuple(inter)), ("intra", tuple(intra))] if intra else [("inter", tuple(inter))]
    graph.step(tuple(inter[:1]))
    if len(inter) > 1:
        graph.step(tuple(inter))
    graph.op_chain(inter[0], settings.chain_ops)
    for link, a, b in pairs:
        graph.p2p(a, b, link, 4, hops=settings.transfer_hops, kind="sendrecv")
        for nbytes in settings.sizes:
            graph.p2p(a, b, link, nbytes)
    for link, members in groups:
        if len(members) < 2:
            continue
        wanted = settings.group_sizes or default_group_sizes(len(members))
        for size in sorted(s for s in wanted if 2 <= s <= len(members)):
            for nbytes in settings.sizes:
                graph.allreduce(members[:size], link, nbytes)
                graph.ps(members[:size], link, nbytes)
                graph.broadcast(members[:size], link, nbytes)


def task_devices(device_names: list[str]) -> dict[int, list[str]]:
    """Devices per task from a session's list_devices(): a task's GPUs when it has any, else its CPUs."""
    found: dict[int, dict[str, list[tuple[int, str]]]] = {}
    for name in device_names:
        match = re.search(r"/task:(\d+)/device:(GPU|CPU):(\d+)$", name)
        if match:
            task, kind, index = int(match[1]), match[2], int(match[3])
            short = f"/job:worker/task:{task}/device:{kind}:{index}"
            found.setdefault(task, {}).setdefault(kind, []).append((index, short))
    return {task: [name for _, name in sorted(kinds.get("GPU") or kinds["CPU"])] for task, kinds in found.items()}


def _wait_for_tasks(session, tasks: int, wait_s: float) -> list[list[str]]:
    """The devices of tasks 0..tasks-1, once every task answers (the servers of a real cluster start
    when their owners start them)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = task_devices([d.name for d in session.list_devices()])
        missing = [k for k in range(tasks) if k not in found]
        if not missing:
            return [found[k] for k in range(tasks)]
        if time.monotonic() > deadline:
            raise CalibrationError(f"task(s) {', '.join(map(str, missing))} did not answer within {wait_s:g} s; "
                                   "are their servers running?")
        time.sleep(1.0)


# ---------------------------------------------------------------- running the steps


class Watchdog:
    """Calls `on_hang` once when a step outlives its deadline: stopping the servers ends the step."""

    def __init__(self, on_hang: Callable[[], None]):
        self.on_hang = on_hang
        self.deadline: float | None = None
        self.fired = False
        self._stop = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            if self.deadline is not None and time.monotonic() > self.deadline and not self.fired:
                self.fired = True
                self.on_hang()

    def close(self) -> None:
        self._stop.set()


def measure(target: str, tasks: int, settings: CalibrationSettings, on_hang: Callable[[], None],
            progress: bool = True, wait_s: float = 120.0) -> list[Sample]:
    """Connect to `target` (task 0 of a cluster of `tasks`), build every series and time it."""
    import tensorflow as tf
    from tqdm import tqdm

    graph = CalibrationGraph(settings.step_timeout_s)
    session = tf.compat.v1.Session(target, graph=graph.graph, config=session_config(settings.step_timeout_s))
    watchdog = Watchdog(on_hang)
    options = tf.compat.v1.RunOptions(timeout_in_ms=int(settings.step_timeout_s * 1000))

    def timed(op, what: str) -> float:
        watchdog.deadline = time.monotonic() + settings.step_timeout_s + HANG_GRACE_S
        start = time.perf_counter()
        try:
            session.run(op, options=options)
        except tf.errors.OpError as exc:
            if watchdog.fired:
                raise CalibrationError(f"{what}: the step did not finish within {settings.step_timeout_s:g} s; "
                                       "the servers were stopped") from None
            raise CalibrationError(f"{what}: {type(exc).__name__}: {_headline(str(exc))}") from None
        finally:
            watchdog.deadline = None
        return time.perf_counter() - start

    try:
        devices = _wait_for_tasks(session, tasks, wait_s)
        build_series(graph, devices, settings)
        timed(graph.init, "initialising the payloads")
        samples: list[Sample] = []
        with tqdm(total=len(graph.series), desc="calibrate", unit="series", file=sys.stderr,
                  disable=not progress, leave=False) as bar:
            for series in graph.series:
                bar.set_postfix_str(series.label)
                samples += _time_series(series, settings, timed)
                bar.update()
        return samples
    finally:
        watchdog.close()
        session.close()


def _time_series(series: Series, settings: CalibrationSettings, timed: Callable) -> list[Sample]:
    for _ in range(max(1, settings.warmup)):  # the first run of a step registers its graph on every task
        timed(series.target, series.label)
        if series.base is not None:
            timed(series.base, series.label)
    base_times, target_times = [], []
    for _ in range(settings.repeats):  # interleaved, so that drift hits both alike
        if series.base is not None:
            base_times.append(timed(series.base, series.label))
        target_times.append(timed(series.target, series.label))
    base = median(base_times) if base_times else 0.0
    samples = []
    for run, seconds in enumerate(target_times):
        value = (seconds - base) / series.per_step
        if not (math.isfinite(value) and value > 0):
            raise CalibrationError(f"{series.label}: run {run} took {seconds * 1e3:.3f} ms, no longer than the same "
                                   f"step without its payload ({base * 1e3:.3f} ms median); the noise hides it: "
                                   "use more --repeats")
        samples.append(Sample(series.kind, series.link, series.group_size, series.bytes, run, value))
    return samples


def _headline(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    useful = [line for line in lines if line != "Graph execution error:" and not line.startswith("Detected at")]
    return (useful or lines or [""])[0][:300]


# ---------------------------------------------------------------- local and real clusters


def local_topology(name: str, tasks: int, gbps: float) -> Topology:
    """This machine as `tasks` one-device machines task0.. of GPU type "cpu" joined at `gbps`."""
    figure = float(f"{gbps:.4g}")
    cpu = lookup_gpu("cpu", "gpu")
    # One device per machine: intra_gbps carries no traffic; the link figure stands in for it.
    machines = tuple(Machine(name=f"task{k}", gpu=cpu, count=1, intra_gbps=figure) for k in range(tasks))
    return Topology(name=name, machines=machines, inter_gbps=figure)


def _fit(samples: list[Sample], topology: str, topology_hash: str, source: str) -> Calibration:
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
        samples = measure(cluster.target(0), tasks, settings, on_hang=lambda: _stop_all(cluster.pids),
                          progress=progress)
    name = name or f"local-{tasks}"
    fitted = _fit(samples, name, "", "local")  # the topology takes its bandwidth from the fit, then its hash
    topology = local_topology(name, tasks, fitted.links["inter"].gbps)
    return replace(fitted, topology_hash=topology.content_hash()), topology


def calibrate_cluster(topology: Topology, cluster: dict[str, list[str]], settings: CalibrationSettings,
                      progress: bool = True) -> Calibration:
    """Measure a real cluster whose tasks 1.. already serve (`tag calibrate --cluster ... --task-index K`);
    task 0 is served from here."""
    devices = topology.machines[0].count
    with task_servers(cluster, [0], devices_per_task=devices, threads=None) as servers:
        samples = measure(f"grpc://{servers[0].address}", topology.num_machines, settings,
                          on_hang=lambda: _stop_all([servers[0].pid]), progress=progress)
    return _fit(samples, topology.name, topology.content_hash(), "cluster")


def _stop_all(pids: list[int]) -> None:
    import os
    import signal

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
