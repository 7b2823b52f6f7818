"""A step whose every op lies on one device of task 0 runs in the client's own session, with no server.

Planned for a local cluster of pinned single-core tasks, a small model often keeps all its work on task 0:
the second core does not pay for its transfers. Through TF's distributed runtime such a step still pays a
session.run's round trip from the client through the master to task 0 and the feed over gRPC, about 1 ms a
step here against the graph's own 0.5-3.7 ms (benchmarks/train_trace.md). `tag train` runs it instead in a
direct session of the trainer process, pinned to the core task 0 would have and with the pools a task has,
so that it computes what the plan assumed, on the same device, without the round trip.
"""

from __future__ import annotations

import re

TASK0 = re.compile(r"^/job:worker(?:/replica:0)?/task:0(?=/|$)")


def _local(device: str) -> str:
    return TASK0.sub("", device)


def on_one_device(graph_def) -> bool:
    """Whether every node of the emitted step lies on the same device of task 0."""
    devices = {node.device for node in graph_def.node}
    return len(devices) == 1 and TASK0.match(next(iter(devices))) is not None


def local_step(graph_def, meta: dict) -> tuple[object, dict]:
    """The step and its emission facts with task 0's device named as the process's own ("/device:CPU:0")."""
    for node in graph_def.node:
        node.device = _local(node.device)
    variables = [{**v, "copies": [[handle, _local(device), assign] for handle, device, assign in v["copies"]]}
                 for v in meta["variables"]]
    return graph_def, {**meta, "variables": variables}
