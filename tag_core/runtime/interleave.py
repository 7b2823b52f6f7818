"""Measure several emitted graphs of one topology interleaved, on one pinned local cluster.

Strategies timed one after another each see the machine at another moment: on a machine shared with
other work, a change of load between two runs reorders them. `measure_interleaved` starts one pinned
single-core server process per task (tag_core.runtime.local_cluster) and a child process (this
module's `main`) with one session per graph on task 0. After every graph's variables are initialised
and its `warmup` untimed steps run, it goes round: in each round every graph (in a rotated order) runs
one untimed step, since switching graphs leaves cold caches, then its share of the timed steps. Each
graph's timing is the median and interquartile range over all of its timed steps. With `between_rounds`,
the child waits after each round but the last while the parent calls it (a profile of the model, taken
while the servers idle, sees the machine as the rounds around it do); the time it takes is not the
measurement's and extends the deadline.

The graphs share the servers, so each one's collective keys are moved to a range of its own, and its
variables live in a resource container of its own. The parent kills the child at the deadline; every
process is gone when `measure_interleaved` returns. The parent also watches the server processes: when one
dies, it stops the measurement at once with one line naming the task (tag_core.runtime.server_death), and each
graph keeps the steps it had timed by then.
"""

from __future__ import annotations

import argparse
import json
import math
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tag_core import tf_children
from tag_core.errors import TagInputError

from .measure import StepTiming
from .server_death import ServerWatch

KEY_STRIDE = 1_000_000  # collective group and instance keys of graph k start at k * KEY_STRIDE
STARTUP_S = 120.0  # TF import and registering every graph


@dataclass
class Interleaved:
    """One graph's outcome: its timed steps, or the error that dropped it; `stopped` says why the measurement
    ended before all its steps were timed (those it timed stand)."""

    folder: Path
    seconds: list[float] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)  # each timed step's graph's place in its round (0: first)
    error: str | None = None
    stopped: str | None = None

    @property
    def timing(self) -> StepTiming | None:
        return StepTiming(tuple(self.seconds)) if self.seconds and self.error is None else None


def measure_interleaved(folders: list[Path], steps: int, warmup: int, rounds: int, timeout: float = 600.0,
                        echo: Callable[[str], None] | None = None,
                        between_rounds: Callable[[int], None] | None = None) -> list[Interleaved]:
    """Time `steps` steps of each emission folder, interleaved over `rounds` rounds (see the module docstring)."""
    from .local_cluster import ServerStartError, child_env, local_cluster
    from .run_result import one_line_tail
    from .supervisor import _kill, _pump, check_folder, pinned_problem

    echo = echo or (lambda line: None)
    outcomes = [Interleaved(Path(f)) for f in folders]
    metas = [check_folder(f)["emission"] for f in folders]
    tasks = {len(m["tasks"]) for m in metas}
    if len(tasks) != 1:
        raise TagInputError("folders", f"interleaved graphs must share their tasks; these have {sorted(tasks)}")
    problem = pinned_problem(metas[0])
    if problem:
        raise TagInputError("folders", f"the graphs cannot run as one pinned process per task: {problem}")
    command = [sys.executable, "-m", "tag_core.runtime.interleave", "--steps", str(steps), "--warmup", str(warmup),
               "--rounds", str(rounds), "--timeout", str(timeout), *map(str, folders)]
    if between_rounds is not None:
        command.append("--pause")
    try:
        with local_cluster(tasks.pop(), where="folders") as cluster:
            child = tf_children.popen(command + cluster.client_args(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=child_env(threads=None),
                                     start_new_session=True,
                                     stdin=subprocess.PIPE if between_rounds is not None else subprocess.DEVNULL)

            def resume(round_index: int) -> None:
                between_rounds(round_index)
                try:
                    child.stdin.write("\n")
                    child.stdin.flush()
                except OSError:  # the child has ended: its events say how
                    pass

            events: queue.Queue = queue.Queue()
            stderr_tail: deque = deque(maxlen=40)
            threading.Thread(target=_pump, args=(child.stdout, events.put), daemon=True).start()
            threading.Thread(target=_pump, args=(child.stderr, stderr_tail.append), daemon=True).start()
            deadline = time.monotonic() + timeout + STARTUP_S
            try:
                finished = _follow(events, outcomes, deadline, echo, resume, ServerWatch(cluster.servers))
            finally:
                _kill(child)
    except ServerStartError as exc:
        finished, stderr_tail = f"the local TF servers did not start: {exc}", deque()
    if finished is not True:
        message = finished or f"the measuring process ended early: {one_line_tail(stderr_tail)}"
        echo(message)
        for outcome in outcomes:
            if outcome.error is None and outcome.seconds:  # what was timed before stands
                outcome.stopped = message
            elif outcome.error is None:
                outcome.error = message
    return outcomes


def position_bias(outcomes: list[Interleaved]) -> list[dict[str, Any]]:
    """How a step's time goes with its graph's place in the round: per place, the median over the steps timed
    there of each step over its own graph's median (1.0: no bias), and how many steps that is. Rotating the
    order spreads the bias over the graphs; this says how large it is."""
    ratios: dict[int, list[float]] = {}
    for outcome in outcomes:
        if not outcome.seconds or len(outcome.positions) != len(outcome.seconds):
            continue
        median = statistics.median(outcome.seconds)
        for position, seconds in zip(outcome.positions, outcome.seconds):
            if position >= 0 and median > 0:
                ratios.setdefault(position, []).append(seconds / median)
    return [{"position": p, "ratio": statistics.median(r), "steps": len(r)} for p, r in sorted(ratios.items())]


def _follow(events: queue.Queue, outcomes: list[Interleaved], deadline: float, echo: Callable[[str], None],
            resume: Callable[[int], None], watch: ServerWatch) -> bool | str | None:
    """Read the child's events into `outcomes`: True when it finished, else why not (None: it just ended).
    The servers are polled about once a second: a dead one ends the measurement, whatever TF would still wait for."""
    from .server_death import death_within
    from .supervisor import _parse

    while True:
        wait = deadline - time.monotonic()
        if wait <= 0:
            return "the interleaved measurement did not finish in time; it was stopped"
        died = watch.death()
        if died is not None:
            return died
        try:
            line = events.get(timeout=min(wait, 1.0))
        except queue.Empty:
            continue
        if line is None:
            return None
        event = _parse(line)
        if event is None:
            continue
        kind = event["event"]
        if kind == "input_error":
            raise TagInputError(event["where"], event["message"])
        if kind == "step":
            outcomes[event["graph"]].seconds.append(event["seconds"])
            outcomes[event["graph"]].positions.append(event.get("position", -1))
        elif kind == "error":
            died = death_within(watch)  # the server's death, not the graph's own error
            if died is not None:
                return died
            outcomes[event["graph"]].error = event["message"]
            echo(f"{outcomes[event['graph']].folder.name}: {event['message']}")
        elif kind == "round":
            echo(f"round {event['round'] + 1} of {event['rounds']}")
        elif kind == "ready":
            echo(f"{outcomes[event['graph']].folder.name}: initialised")
        elif kind == "paused":
            paused = time.monotonic()
            resume(event["round"])
            deadline += time.monotonic() - paused
        elif kind == "done":
            return True


# ---------------------------------------------------------------- the measuring process


def separate(graph_def, index: int) -> None:
    """Give graph `index` collective keys and a variable container of its own (it shares the servers)."""
    import tensorflow as tf

    nodes = {node.name: node for node in graph_def.node}
    offset = (index + 1) * KEY_STRIDE
    moved: set[str] = set()
    for node in graph_def.node:
        if node.op.startswith("Collective") and len(node.input) >= 4:
            for position in (2, 3):  # CollectiveReduceV2: input, group_size, group_key, instance_key
                const = nodes[node.input[position].split(":")[0]]
                if const.name not in moved:
                    value = tf.make_ndarray(const.attr["value"].tensor)
                    const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value + offset))
                    moved.add(const.name)
        if node.op == "VarHandleOp":
            node.attr["container"].s = f"tag_interleaved_{index}".encode()


def run(args) -> int:
    import tensorflow as tf

    from tag_core.capture.trace import synthetic_batch

    from .local_cluster import session_target
    from .worker import Distributed, _headline, _load_graph_def, _spec_like, initial_values, report

    graphs: list[tuple[int, Any, dict, dict] | None] = []
    deadline = time.monotonic() + args.timeout
    target = session_target(args.target, args.client_cluster)

    def options():
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            raise tf.errors.DeadlineExceededError(None, None, "the run's time is up")
        return tf.compat.v1.RunOptions(timeout_in_ms=remaining_ms)

    for k, folder in enumerate(map(Path, args.folders)):
        plan = json.loads((folder / "plan.json").read_text())
        meta = plan["emission"]
        runs = args.warmup + args.steps + args.rounds  # and one untimed step per round
        graph_def = _load_graph_def(folder, meta, args.timeout, meta["device_kind"] == "gpu", runs=runs,
                                    share=1 / len(args.folders))
        separate(graph_def, k)
        try:
            distributed = Distributed(graph_def, meta, target, soft=False)
            distributed.initialise(initial_values(folder, meta), options())
            for step in range(args.warmup):
                distributed.step(synthetic_batch(_spec_like(meta), plan["batch_size"], seed=step), options())
        except tf.errors.OpError as exc:
            report("error", graph=k, message=f"{type(exc).__name__}: {_headline(str(exc))}")
            graphs.append(None)
            continue
        graphs.append((k, distributed, plan, meta))
        report("ready", graph=k)
    per_round = math.ceil(args.steps / args.rounds)
    left = {k: args.steps for k in range(len(graphs))}
    for r in range(args.rounds):
        report("round", round=r, rounds=args.rounds)
        live = [g for g in graphs if g is not None]
        shift = r % max(len(live), 1)
        rotated = live[shift:] + live[:shift]  # no graph always runs first
        for position, (k, distributed, plan, meta) in enumerate(rotated):
            spec = _spec_like(meta)
            try:
                for i in range(1 + min(per_round, left[k])):  # the first step after a switch is untimed
                    batch = synthetic_batch(spec, plan["batch_size"], seed=args.warmup + r * (per_round + 1) + i)
                    start = time.perf_counter()
                    distributed.step(batch, options())
                    seconds = time.perf_counter() - start
                    if i:
                        left[k] -= 1
                        report("step", graph=k, round=r, position=position, seconds=seconds)
            except tf.errors.OpError as exc:
                report("error", graph=k, message=f"{type(exc).__name__}: {_headline(str(exc))}")
                graphs[k] = None
        if args.pause and r < args.rounds - 1:
            report("paused", round=r)
            paused = time.monotonic()
            sys.stdin.readline()  # the parent's go (or its end: "")
            deadline += time.monotonic() - paused
    report("done")
    return 0


def main(argv: list[str] | None = None) -> int:
    from .local_cluster import add_target_arguments
    from .parent_watch import exit_with_parent
    from .worker import FolderError, report

    parser = argparse.ArgumentParser(prog="python -m tag_core.runtime.interleave")
    parser.add_argument("folders", nargs="+")
    add_target_arguments(parser)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--pause", action="store_true", help="after each round but the last, wait for a line on stdin")
    exit_with_parent()
    try:
        return run(parser.parse_args(argv))
    except FolderError as exc:
        report("input_error", where="DIR", message=str(exc))
        return 2


if __name__ == "__main__":
    sys.exit(main())
