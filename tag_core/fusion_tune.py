"""Just-in-time tuning of a fusion plan: time each pattern for real, keep the winners.

Each pattern is cut out of the step graph into a micro-graph (its external
inputs become placeholders) and timed twice, as plain TF ops and as one XLA
cluster. Patterns with the same op types and input shapes are timed once.
On this machine that means XLA on the CPU; on a GPU host, the same code times
GPU kernels.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import numpy as np

from .fusion import FusionPlan

TUNE_RUNS = 15


def tune_plan(plan: FusionPlan, graph_def, runs: int = TUNE_RUNS, progress: bool = False) -> FusionPlan:
    import tensorflow as tf
    from tqdm import tqdm

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    timings: dict[tuple, tuple[float, float]] = {}
    kept, dropped = [], 0
    for pattern in tqdm(plan.patterns, desc="tune fusion", unit="pattern", disable=not progress):
        micro = _micro_graph(graph, pattern)
        if micro is None:  # shapes unknown: cannot be timed alone, keep the planner's choice
            kept.append(pattern)
            continue
        signature, graph_def_micro, feeds, fetches = micro
        if signature not in timings:
            plain = _time(graph_def_micro, feeds, fetches, runs, xla=False)
            fused = _time(graph_def_micro, feeds, fetches, runs, xla=True)
            timings[signature] = (plain, fused)
        plain, fused = timings[signature]
        if fused < plain:
            kept.append(pattern)
        else:
            dropped += 1
    fused_ops = sum(len(p) for p in kept)
    measured = dict(plan.measured, tuned_patterns_kept=len(kept), tuned_patterns_dropped=dropped,
                    tuned_signatures=len(timings))
    return replace(
        plan,
        patterns=kept,
        kernels_after=plan.kernels_before - fused_ops + len(kept),
        measured=measured,
    )


def _micro_graph(graph, pattern: list[str]):
    """(signature, GraphDef, feeds, fetch names) of one pattern, or None when a shape is unknown."""
    import tensorflow as tf

    members = set(pattern)
    ops = [graph.get_operation_by_name(name) for name in pattern]
    # Constants read only by the pattern travel with it (XLA needs shape arguments as constants).
    for op in list(ops):
        for tensor in op.inputs:
            if tensor.op.type == "Const" and tensor.op.name not in members:
                members.add(tensor.op.name)
                ops.insert(0, tensor.op)
    external = []
    for op in ops:
        for tensor in op.inputs:
            if tensor.op.name not in members and tensor.name not in external:
                external.append(tensor.name)
    outputs = [
        t.name for op in ops if op.type != "Const" for t in op.outputs
        if any(c.name not in members for c in t.consumers()) or not t.consumers()
    ]
    micro = tf.compat.v1.GraphDef()
    feeds, signature = {}, [tuple(op.type for op in ops)]
    for k, name in enumerate(external):
        tensor = graph.get_tensor_by_name(name)
        if not tensor.shape.is_fully_defined():
            return None
        placeholder = micro.node.add(name=f"tag_input_{k}", op="Placeholder")
        placeholder.attr["dtype"].type = tensor.dtype.as_datatype_enum
        placeholder.attr["shape"].shape.CopyFrom(tensor.shape.as_proto())
        feeds[f"tag_input_{k}:0"] = _sample(tensor.shape.as_list(), tensor.dtype)
        signature.append((tuple(tensor.shape.as_list()), tensor.dtype.name))
    renamed = {name: f"tag_input_{k}:0" for k, name in enumerate(external)}
    for op in ops:
        node = micro.node.add()
        node.CopyFrom(op.node_def)
        node.ClearField("input")
        for tensor in op.inputs:
            node.input.append(renamed.get(tensor.name, tensor.name))
        node.device = ""
    return tuple(signature), micro, feeds, outputs


def _sample(shape: list[int], dtype) -> np.ndarray:
    if dtype.is_floating:
        return np.random.default_rng(0).standard_normal(shape).astype(dtype.as_numpy_dtype) * 0.1 + 1.0
    # Zeros are valid indices, axes and flags for every integer or boolean input.
    return np.zeros(shape, dtype=dtype.as_numpy_dtype)


def _time(graph_def, feeds, fetches, runs: int, xla: bool) -> float:
    import tensorflow as tf

    graph_def = _copy(graph_def)
    if xla:
        for node in graph_def.node:
            if node.op != "Placeholder":
                node.attr["_XlaCompile"].b = True
                node.attr["_XlaScope"].s = b"tune"
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        for _ in range(3):  # compile and warm up
            session.run(fetches, feed_dict=feeds)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            session.run(fetches, feed_dict=feeds)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _copy(graph_def):
    import tensorflow as tf

    copy = tf.compat.v1.GraphDef()
    copy.CopyFrom(graph_def)
    return copy
