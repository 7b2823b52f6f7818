"""Run an emitted step on TF's distributed runtime, optionally checking it against the single-device step.

`run_emitted(folder, ...)` starts `tag_core.runtime.worker` as a child process that feeds
deterministic synthetic batches and, with `check`, runs the original step on the same data and
initial values and compares the loss and every copy of every variable after each step. Where the
tasks serve (`servers`):

- "pinned" (the default when every task has one CPU device and the machine has a core per task, as
  on the topology `tag calibrate --local N` writes): one TF server process per task, pinned to its
  own core with one thread (tag_core.runtime.local_cluster), the worker a client of task 0. The
  devices then really compute in parallel, as the calibration measured them.
- "shared": one local `tf.distribute.Server` per task inside the worker (as many logical CPU devices
  as the machine has GPUs); they share the worker's threads and the machine's cores.

Both local modes run the servers and the worker in a network namespace of their own with only `lo` up
(tag_core.runtime.loopback): TF binds its servers to 0.0.0.0, and there that is loopback of the namespace,
which nothing outside can reach. A real cluster ("cluster") uses none.

Everything in-process in TF (servers, a collective that waits for a peer that never
comes) ends with the child: the parent kills it at the deadline, so a hang never hangs the
user, and every server started is gone when this returns. Collectives carry the timeout
too, so a missing peer normally fails the step with the op and devices named.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Sequence

from tag_core import tf_children
from tag_core.errors import TagInputError

from .loopback import NamespaceRefused, child_environment, join_from_environment, loopback_namespace
from .run_result import LOOPBACK_WHERE, RunResult, describe, failure_message, hang_message
from .server_death import ServerWatch, death_within

# Every TF child of this package runs as `python -m tag_core.runtime.<module>`, which imports this module first
# (tag_core.runtime imports it): a child started inside a local run's network namespace joins it here, before
# anything in it starts a thread (see tag_core.runtime.loopback). Nothing happens in any other process.
join_from_environment()

STARTUP_S = 90.0  # TF import, servers and graph import, before the run's own clock starts
SERVER_MODES = ("auto", "pinned", "shared")


def _check_folder(folder: Path, check: bool) -> dict:
    for name in ("plan.json", "graph.pb"):
        if not (folder / name).is_file():
            raise TagInputError("DIR", f"{folder} has no {name}; make it with `tag emit`")
    try:
        plan = json.loads((folder / "plan.json").read_text())
        meta = plan["emission"]
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, KeyError, TypeError):
        raise TagInputError("DIR", f"{folder / 'plan.json'} is not a plan written by `tag emit`") from None
    if check and not (folder / meta["reference"]).is_file():
        raise TagInputError("--check", f"{folder} has no single-device reference step ({meta['reference']})")
    return plan


def check_cluster(path: Path, tasks: int) -> None:
    """A cluster.json as `tag emit` writes it: {"cluster": {"worker": [one "host:port" per task]}}."""
    if not path.is_file():
        raise TagInputError("--cluster", f"{path} does not exist")
    try:
        workers = json.loads(path.read_text())["cluster"]["worker"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, KeyError, TypeError):
        raise TagInputError("--cluster", f'{path} is not a cluster file: expected {{"cluster": {{"worker": '
                                         '["host:port", ...]}}') from None
    if not isinstance(workers, list) or not all(isinstance(w, str) and ":" in w for w in workers):
        raise TagInputError("--cluster", f"{path}: cluster.worker must be a list of \"host:port\" strings")
    if len(workers) != tasks:
        raise TagInputError("--cluster", f"{path} lists {len(workers)} workers; this graph has {tasks} tasks")


def check_folder(folder: str | Path) -> dict:
    """The plan.json of an emission folder; TagInputError naming DIR when `folder` is not one."""
    return _check_folder(Path(folder), False)


def pinned_problem(meta: dict) -> str | None:
    """Why the tasks of this emission cannot run as pinned single-core processes here (None: they can)."""
    from .local_cluster import pinnable_cores

    tasks = meta["tasks"]
    if any(count != 1 for count in tasks):
        return f"its tasks have {', '.join(map(str, tasks))} devices; pinned tasks have one each"
    cores = pinnable_cores()
    if len(tasks) > len(cores):
        return f"its {len(tasks)} tasks need {len(tasks)} cores; this process may use {len(cores)}"
    return None


def server_mode(meta: dict, servers: str = "auto", cluster: str | Path | None = None) -> str:
    """"cluster", "pinned" or "shared" (see the module docstring); TagInputError for a mode that cannot be."""
    if servers not in SERVER_MODES:
        raise TagInputError("--servers", f"must be one of {', '.join(SERVER_MODES)}, got {servers!r}")
    if cluster is not None:
        if servers != "auto":
            raise TagInputError("--servers", "does not apply with --cluster (the cluster's servers run the tasks)")
        return "cluster"
    problem = pinned_problem(meta)
    if servers == "pinned" and problem:
        raise TagInputError("--servers", f"pinned: the graph cannot run as one pinned process per task: {problem}")
    if servers == "auto":
        # GPU graphs run here only to be checked: their tasks keep the in-process servers.
        return "pinned" if problem is None and meta["device_kind"] == "cpu" else "shared"
    return servers


def run_emitted(folder: str | Path, steps: int = 3, check: bool = False, timeout: float = 600.0,
                cluster: str | Path | None = None, task_index: int = 0,
                echo: Callable[[str], None] | None = None, warmup: int = 0, servers: str = "auto",
                rewrites: bool = True, warmup_s: float = 0.0) -> RunResult:
    """Run untimed steps (`warmup`, and more until `warmup_s` has passed: warmup.still_warming), then `steps`
    steps of the emitted folder; see the module docstring. `rewrites`
    False runs the distributed session without grappler: much faster to start on big graphs, for checks
    whose times do not count."""
    folder = Path(folder)
    plan = _check_folder(folder, check)
    meta = plan["emission"]
    if cluster is not None:
        check_cluster(Path(cluster), len(meta["tasks"]))
        if not 0 <= task_index < len(meta["tasks"]):
            raise TagInputError("--task-index", f"must lie in [0, {len(meta['tasks'])}) for this graph")
    mode = server_mode(meta, servers, cluster)
    command = [sys.executable, "-m", "tag_core.runtime.worker", str(folder), "--steps", str(steps),
               "--timeout", str(timeout), "--warmup", str(warmup), "--warmup-seconds", str(warmup_s)]
    if check:
        command.append("--check")
    if not rewrites:
        command.append("--rewrites-off")
    if cluster is not None:
        command += ["--cluster", str(cluster), "--task-index", str(task_index)]
    serving = cluster is not None and task_index != 0  # serves until stopped: no deadline
    return run_child(command, meta, mode, echo, None if serving else timeout + STARTUP_S, timeout)


Handler = Callable[[dict, RunResult], list[str]]


def run_child(command: list[str], meta: dict, mode: str, echo: Callable[[str], None] | None,
              limit_s: float | None, timeout: float, handle: Handler | None = None,
              silence_s: float | None = None) -> RunResult:
    """Run a client child (`command`, a module of this package that reports JSON events on stdout) against the
    tasks of `meta` served as `mode` says ("pinned", "shared", "cluster", or "direct": no server, the child's own
    session, tag_core.runtime.direct), and turn its events into lines with
    `handle` (default `describe`). It is killed after `limit_s` seconds (None: never) or `silence_s` seconds
    without a line from it (an event's "quiet_s" sets that bound from then on: a client says how long its next
    phase may take, since TF does not always end a step that waits for a lost task); `timeout` is what the
    messages quote."""
    echo = echo or (lambda line: None)
    handle = handle or describe
    if mode == "pinned":
        return _run_pinned(command, meta, timeout, echo, limit_s, handle, silence_s)
    deadline = None if limit_s is None else time.monotonic() + limit_s
    if mode in ("cluster", "direct"):  # a real cluster's tasks reach each other: no namespace can hold them
        result = _supervise(command, meta, deadline, timeout, echo, handle, silence_s)
    else:  # shared: the worker's in-process servers and its session, in a namespace with only lo up
        try:
            with loopback_namespace():
                result = _supervise(command, meta, deadline, timeout, echo, handle, silence_s)
        except NamespaceRefused as exc:
            result = RunResult(ok=False, error=f"the local TF servers did not start: {exc}")
            result.lines.append(result.error)
            echo(result.error)
    result.servers = mode
    return result


def _run_pinned(command: list[str], meta: dict, timeout: float, echo: Callable[[str], None],
                limit_s: float | None, handle: Handler, silence_s: float | None) -> RunResult:
    """The client as a client of one pinned server process per task; every process is gone on return."""
    from .local_cluster import ServerStartError, local_cluster

    tasks = len(meta["tasks"])
    try:
        with local_cluster(tasks, where="DIR") as cluster:
            started = ", ".join(f"task {s.task} on core {s.core} (process {s.pid})" for s in cluster.servers)
            line = f"started {tasks} pinned single-core TF server processes: {started}"
            if cluster.isolated:
                line += f"; {LOOPBACK_WHERE}"
            echo(line)
            deadline = None if limit_s is None else time.monotonic() + limit_s
            result = _supervise(command + cluster.client_args(), meta, deadline, timeout, echo, handle, silence_s,
                                servers=cluster.servers)
            result.lines.insert(0, line)
            result.server_pids = cluster.pids
            result.server_cores = [s.core for s in cluster.servers]
    except ServerStartError as exc:
        result = RunResult(ok=False, error=f"the local TF servers did not start: {exc}")
        result.lines.append(result.error)
        echo(result.error)
    result.servers = "pinned"
    return result


def _supervise(command: list[str], meta: dict, deadline: float | None, timeout: float,
               echo: Callable[[str], None], handle: Handler | None = None, silence_s: float | None = None,
               servers: Sequence = ()) -> RunResult:
    # The worker never uses Keras. TensorFlow imports all of Keras at start-up (and matplotlib with it) unless
    # told to use the legacy tf_keras package, which it then skips when absent: 2 of 6 s and 80 MB per run.
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "TF_USE_LEGACY_KERAS": "1",
           **child_environment()}  # in the local run's namespace, if one is held
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds tag_core
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    child = tf_children.popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)  # its own process group: killed as a whole
    events: queue.Queue = queue.Queue()
    stderr_tail: deque = deque(maxlen=60)
    threading.Thread(target=_pump, args=(child.stdout, events.put), daemon=True).start()
    threading.Thread(target=_pump, args=(child.stderr, stderr_tail.append), daemon=True).start()
    result = RunResult(ok=False)
    handle = handle or describe
    stage = "starting"
    heard = time.monotonic()
    watch = ServerWatch(servers)
    try:
        while True:
            died = watch.death()  # TF may wait out a long timeout for a dead peer: stop now, naming it
            if died is not None:
                _kill(child)
                result.error = f"{stage} was stopped: {died}"
                break
            now = time.monotonic()
            wait = None if deadline is None else deadline - now
            if wait is not None and wait <= 0:
                _kill(child)
                result.error = hang_message(stage, timeout, meta)
                break
            if silence_s is not None and now - heard > silence_s:
                _kill(child)
                result.error = f"{stage} did not finish within {silence_s:g} s; the run was stopped"
                break
            try:
                line = events.get(timeout=1.0 if wait is None else min(wait, 1.0))
            except queue.Empty:
                continue
            heard = time.monotonic()
            if line is None:  # the child closed its output
                child.wait()
                break
            event = _parse(line)
            if event is None:
                continue
            if silence_s is not None and event.get("quiet_s") is not None:  # how long the client's next phase may take
                silence_s = float(event["quiet_s"])
            if event["event"] == "input_error":  # a file of the folder is unreadable: the user's input
                raise TagInputError(event["where"], event["message"])
            stage = _stage_after(event, stage)
            if event["event"] == "error" and servers:
                died = death_within(watch)  # then TF's error is only its echo
                if died is not None:
                    result.error = f"{stage} was stopped: {died}"
                    break
            for text in handle(event, result):
                result.lines.append(text)
                echo(text)
    finally:
        if child.poll() is None:
            _kill(child)
    if result.error is None and child.returncode != 0 and not any(s.get("passed") is False for s in result.steps):
        result.error = failure_message(stderr_tail)
    if result.error:
        result.lines.append(result.error)
        echo(result.error)
    result.ok = result.error is None and child.returncode == 0
    return result


def _pump(stream, put: Callable[[Any], None]) -> None:
    for line in stream:
        put(line.rstrip("\n"))
    put(None)


def _kill(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()


def _parse(line: str | None) -> dict | None:
    if not line or not line.startswith("{"):
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def _stage_after(event: dict, stage: str) -> str:
    if event["event"] == "start":
        return "initialising variables"
    if event["event"] == "step":
        return f"step {event['step'] + 1}"
    if event["event"] == "phase":
        return event["what"]
    if event["event"] in ("checkpoint", "epoch"):
        return f"step {event['step'] + 1}"
    return stage
