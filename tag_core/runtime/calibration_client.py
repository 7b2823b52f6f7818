"""The process that times the calibration steps: a graph-mode session on task 0 of a cluster.

`tag calibrate` starts it as a child (tag_core.runtime.calibrate.measure) so that a step that never
ends (a collective waiting for a peer, an RPC that gRPC keeps retrying after a server died) ends with
the process. It reports one JSON object per line on stdout:

    {"event": "devices", "tasks": [[device, ...], ...]}    the devices of every task, once all answer
    {"event": "series", "total"}                           the series are built; their warm-up starts
    {"event": "round", "index", "total"}                   a round of timing every series starts
    {"event": "step", "label"}                             a step is about to run (the parent's deadline)
    {"event": "samples", "rows": [Sample fields, ...]}     a series' samples (after the last round)
    {"event": "retry", "label", "attempt"}                 a series measured again (load hid its payload)
    {"event": "error", "message"} | {"event": "done"}
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from dataclasses import asdict
from typing import Any, Callable

from tag_core.cluster.calibration import Sample

from .calibrate import CalibrationError, CalibrationSettings
from .calibration_graphs import CalibrationGraph, Series, build_series, session_config
from .local_cluster import add_target_arguments, session_target
from .parent_watch import exit_with_parent


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def task_devices(device_names: list[str]) -> dict[int, list[str]]:
    """Devices per task from a session's list_devices(): a task's GPUs when it has any, else its CPUs."""
    found: dict[int, dict[str, list[tuple[int, str]]]] = {}
    for name in device_names:
        match = re.search(r"/job:worker/(?:replica:\d+/)?task:(\d+)/device:(GPU|CPU):(\d+)$", name)
        if match:
            task, kind, index = int(match[1]), match[2], int(match[3])
            short = f"/job:worker/task:{task}/device:{kind}:{index}"
            found.setdefault(task, {}).setdefault(kind, []).append((index, short))
    return {task: [name for _, name in sorted(kinds.get("GPU") or kinds["CPU"])] for task, kinds in found.items()}


def wait_for_tasks(session, tasks: int, wait_s: float) -> list[list[str]]:
    """The devices of tasks 0..tasks-1 once every task answers (a real cluster's servers start when their
    owners start them)."""
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


ATTEMPTS = 3  # a series whose payload a burst of load hid is measured again, this many times in all


def time_series(series: list[Series], settings: CalibrationSettings, timed: Callable) -> list[list[Sample]]:
    """The samples of every series: warm-up runs of each, then rounds, each timing every series' base and
    target once (`runs` times for the overlap series) after one untimed run, so that a spell of load on
    this shared machine hits every term alike instead of the few measured during it. A sample is
    (target - base) / the payloads chained in the target. The base is the series' fastest base run:
    interference only ever adds time, and the base's own jitter is divided by the chain like the rest. A
    series that the noise hid (a run no longer than its base) is measured again on its own."""
    feeds = [item.feed_dict() for item in series]
    for item, feed in zip(series, feeds):
        for _ in range(max(1, settings.warmup)):  # the first run of a step registers its graph on every task
            timed(item.target, item.label, feed)
            if item.base is not None:
                timed(item.base, item.label)
    times = [([], []) for _ in series]
    for index in range(settings.repeats):
        report("round", index=index, total=settings.repeats)
        for item, feed, (bases, targets) in zip(series, feeds, times):
            timed(item.target, item.label, feed)  # untimed: a step right after another series' runs cold
            _time(item, feed, timed, bases, targets)
    return [_samples(item, *measured) or _again(item, feed, settings, timed)
            for item, feed, measured in zip(series, feeds, times)]


def _time(item: Series, feed: dict | None, timed: Callable, bases: list[float], targets: list[float]) -> None:
    for _ in range(item.runs):
        if item.base is not None:
            bases.append(timed(item.base, item.label))
        targets.append(timed(item.target, item.label, feed))


def _samples(item: Series, bases: list[float], targets: list[float]) -> list[Sample] | None:
    base = min(bases) if bases else 0.0
    values = [(seconds - base) / item.per_step for seconds in targets]
    if not all(math.isfinite(v) and v > 0 for v in values):
        return None
    return [Sample(item.kind, item.link, item.group_size, item.bytes, run, value) for run, value in enumerate(values)]


def _again(item: Series, feed: dict | None, settings: CalibrationSettings, timed: Callable) -> list[Sample]:
    for attempt in range(1, ATTEMPTS):
        report("retry", label=item.label, attempt=attempt)
        bases: list[float] = []
        targets: list[float] = []
        for _ in range(settings.repeats):
            _time(item, feed, timed, bases, targets)
        samples = _samples(item, bases, targets)
        if samples:
            return samples
    base = min(bases) if bases else 0.0
    raise CalibrationError(f"{item.label}: in {ATTEMPTS} attempts, a run took {min(targets) * 1e3:.3f} ms, no "
                           f"longer than the same step without its payload ({base * 1e3:.3f} ms); the noise hides "
                           "it: use more --repeats or larger --sizes, on a quieter machine")


def headline(message: str) -> str:
    """The informative line of a TF error (its first line is often just 'Graph execution error:')."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    useful = [line for line in lines if line != "Graph execution error:" and not line.startswith("Detected at")]
    return (useful or lines or [""])[0][:300]


def run(target: str, tasks: int, settings: CalibrationSettings, wait_s: float) -> int:
    import tensorflow as tf

    graph = CalibrationGraph(settings.step_timeout_s)
    session = tf.compat.v1.Session(target, graph=graph.graph, config=session_config(settings.step_timeout_s))
    options = tf.compat.v1.RunOptions(timeout_in_ms=int(settings.step_timeout_s * 1000))

    def timed(op, label: str, feed: dict | None = None) -> float:
        report("step", label=label)
        start = time.perf_counter()
        try:
            session.run(op, feed_dict=feed, options=options)
        except tf.errors.OpError as exc:
            raise CalibrationError(f"{label}: {type(exc).__name__}: {headline(str(exc))}") from None
        return time.perf_counter() - start

    try:
        devices = wait_for_tasks(session, tasks, wait_s)
        report("devices", tasks=devices)
        build_series(graph, devices, settings)
        timed(graph.init, "initialising the payloads")
        report("series", total=len(graph.series))
        for samples in time_series(graph.series, settings, timed):
            report("samples", rows=[asdict(s) for s in samples])
    except CalibrationError as exc:
        report("error", message=str(exc))
        return 1
    session.close()  # before the servers stop: a session left open to dead servers hangs at exit
    report("done")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tag_core.runtime.calibration_client")
    add_target_arguments(parser)
    parser.add_argument("--tasks", type=int, required=True)
    parser.add_argument("--settings", required=True, help="CalibrationSettings as JSON")
    parser.add_argument("--wait", type=float, default=120.0, help="seconds to wait for every task to answer")
    args = parser.parse_args(argv)
    exit_with_parent()
    fields = json.loads(args.settings)
    settings = CalibrationSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    return run(session_target(args.target, args.client_cluster), args.tasks, settings, args.wait)


if __name__ == "__main__":
    sys.exit(main())
