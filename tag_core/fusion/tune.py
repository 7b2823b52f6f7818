"""Just-in-time tuning of a fusion plan: time each pattern for real, keep the winners.

Each pattern is cut out of the step graph into a micro-graph (its external
inputs become placeholders) and timed twice, as plain TF ops and as one XLA
cluster, in alternating runs so that a change of load on a shared machine
hits both alike. A pattern is kept only when its cluster wins by a margin
(`MIN_WIN_S` and `MIN_WIN_FRACTION`) in the median of the paired runs, and the
confidence interval of that median excludes no gain (paired.py): an XLA cluster
adds executor ops of its own, and a tie is better left to TF. While that interval
still holds the margin, the pattern is timed in more runs (up to `TUNE_RUNS_MAX`):
a decision on a saving near the margin would otherwise flip from run to run.
Patterns with the same op types and input shapes are timed once. Integer and
boolean inputs (shapes, indices, masks) are the step's real values when the
step can be run (`step_values`); floating inputs are random. On this machine that means XLA on the CPU; on a GPU host,
the same code times GPU kernels.
The whole step is then checked: `step_check.py`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace

import numpy as np

from tag_core.capture.graph import copy_graph_def

from .paired import median_interval
from .patterns import FusionPlan

TUNE_RUNS = 15  # paired runs a pattern is timed in...
TUNE_RUNS_MAX = 60  # ...and, while the interval of its saving holds the margin, up to this many
TUNE_GAP_S = 0.001  # pause before each timed run (thread pools spin a while after one)
MIN_WIN_S = 2e-6  # a cluster must save at least this much per step...
MIN_WIN_FRACTION = 0.05  # ...and this share of the pattern's plain time


def tune_plan(plan: FusionPlan, graph_def, roots: list[str], runs: int = TUNE_RUNS, progress: bool = False,
              values=None, regions: bool = True) -> FusionPlan:
    """Keep the patterns whose XLA cluster wins. `values(tensor names)` gives real values of the step's
    non-floating tensors (see `step_values`); without it they are zeros. A pattern that cannot be cut out
    and timed alone (an unknown shape, or its micro-graph fails to run) is dropped: unfused is never slower.

    With `regions`, each compute op is also timed alone, as a TF kernel and as an XLA library call, and the
    plan proposes compiled regions (`regions.compiled_regions`) of everything else the step runs for
    `roots` (the names it fetches); `check_step` decides whether they stay."""
    import tensorflow as tf
    from tqdm import tqdm

    from .patterns import classify
    from .regions import LIBRARY_SLOWDOWN, compiled_regions

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    micros = {}
    for k, pattern in enumerate(plan.patterns):
        micros[k] = _micro_graph(graph, pattern)
    compute = [node.name for node in graph_def.node if classify(node.op) == "compute"] if regions else []
    for name in compute:
        micros[name] = _micro_graph(graph, [name])
    if values is not None:
        wanted = sorted({name for micro in micros.values() if micro is not None for name in micro.exact})
        real = values(wanted) if wanted else {}
        for micro in micros.values():
            if micro is not None:
                for name, placeholder in micro.exact.items():
                    if name in real:
                        micro.feeds[placeholder] = real[name]
    timings: dict[tuple, tuple[float, float] | None] = {}
    kept, dropped, untimed, saving_us = [], 0, 0, []
    for k, pattern in enumerate(tqdm(plan.patterns, desc="tune fusion", unit="pattern", disable=not progress)):
        timing = _timing(micros[k], runs, timings)
        if timing is None:
            untimed += 1
            continue
        if timing.wins:
            kept.append(pattern)
            saving_us.append(round(timing.saving_s * 1e6, 2))
        else:
            dropped += 1
    fused_ops = sum(len(p) for p in kept)
    won = [timing.saving_s for timing in filter(None, timings.values()) if timing.wins]
    measured = dict(plan.measured, tuned_patterns_kept=len(kept), tuned_patterns_dropped=dropped,
                    tuned_patterns_untimed=untimed, tuned_signatures=len(timings),
                    tuned_saving_ms=round(sum(won) * 1e3, 4), pattern_saving_us=saving_us,
                    tuned_signatures_timed_longer=sum(t.runs > runs for t in filter(None, timings.values())))
    outside = set()
    for name in tqdm(compute, desc="time library calls", unit="op", disable=not progress):
        timing = _timing(micros[name], runs, timings)
        if timing is None or timing.fused_s > LIBRARY_SLOWDOWN * timing.plain_s:
            outside.add(name)
    if compute:
        measured.update(library_calls_timed=len(compute), library_calls_outside=len(outside))
    return replace(
        plan,
        patterns=kept,
        kernels_after=plan.kernels_before - fused_ops + len(kept),
        measured=measured,
        regions=compiled_regions(graph_def, outside, roots) if compute else [],
    )


@dataclass(frozen=True)
class PairedTiming:
    """A micro-graph's runs as plain TF ops and as one XLA cluster, in alternating pairs."""

    plain_s: float  # median seconds a run, plain
    fused_s: float  # median seconds a run, as one cluster
    saving_s: float  # median of the paired savings (plain - fused)
    saving_low_s: float  # the low end of its confidence interval
    saving_high_s: float = float("inf")  # the high end
    runs: int = 0

    @property
    def margin_s(self) -> float:
        return max(MIN_WIN_S, MIN_WIN_FRACTION * self.plain_s)

    @property
    def wins(self) -> bool:
        """The median saving clears the margin, and its interval excludes no saving at all."""
        return self.saving_s >= self.margin_s and self.saving_low_s > 0

    @property
    def undecided(self) -> bool:
        """The interval of the saving holds the margin: more runs may move the decision."""
        return self.saving_low_s < self.margin_s <= self.saving_high_s


def _timing(micro, runs: int, timings: dict) -> PairedTiming | None:
    """A micro-graph's paired timing, or None if it cannot run; memoised by signature."""
    import tensorflow as tf

    if micro is None or any(p not in micro.feeds for p in micro.exact.values()):
        return None
    signature = (micro.signature, tuple(_digest(micro.feeds[p]) for p in sorted(micro.exact.values())))
    if signature not in timings:
        try:
            timings[signature] = _time_both(micro, runs)
        except tf.errors.OpError:
            timings[signature] = None
    return timings[signature]


def _digest(value: np.ndarray):
    """Non-floating inputs are part of a signature (a shape or an index changes the work); of floats, the shape."""
    if value.dtype.kind == "f":
        return value.shape
    return hash(value.tobytes()) if value.size <= 64 else (value.shape, hash(value.tobytes()[:4096]))


def step_values(step, spec, names: list[str]) -> dict:
    """The values of `names` (tensors of the step) in one run of the step on synthetic data with random
    parameters; a tensor that cannot be fetched (inside a loop) is left out."""
    import tensorflow as tf

    from tag_core.capture.trace import synthetic_batch
    from tag_core.profile.profiler import initialise_randomly

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(step.graph_def, name="")
    fetchable = []
    for name in names:
        try:
            tensor = graph.get_tensor_by_name(name)
        except (KeyError, ValueError):
            continue
        if graph.is_fetchable(tensor.op) and tensor.op.type not in ("Enter", "Exit", "NextIteration"):
            fetchable.append(name)
    with tf.compat.v1.Session(graph=graph) as session:
        initialise_randomly(session, step)
        feed = dict(zip(step.input_tensors, synthetic_batch(spec, step.batch_size)))
        try:
            found = session.run(fetchable, feed_dict=feed)
        except tf.errors.OpError:
            return {}
    return {name: np.asarray(value) for name, value in zip(fetchable, found)}


@dataclass
class _Micro:
    signature: tuple
    graph_def: object
    feeds: dict  # placeholder -> value, per run
    fetches: list[str]  # tensors leaving the pattern, and ops with no outputs (variable updates)
    exact: dict  # step tensor -> placeholder, for non-floating inputs (real values wanted)
    init_feeds: dict = field(default_factory=dict)  # variables the pattern reads or updates: their values
    init_ops: list[str] = field(default_factory=list)


def _micro_graph(graph, pattern: list[str]) -> _Micro | None:
    """One pattern cut out of the step, or None when it cannot be. External inputs become placeholders (those
    of unknown shape, and non-floating ones, are fed the step's values when known: `exact`); a variable the
    pattern reads or updates becomes a fresh variable of its own, set once before timing."""
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
    outputs += [op.name for op in ops if not op.outputs]
    micro = tf.compat.v1.GraphDef()
    result = _Micro((), micro, {}, outputs, {})
    signature = [tuple(op.type for op in ops)]
    for k, name in enumerate(external):
        tensor = graph.get_tensor_by_name(name)
        if tensor.dtype == tf.resource:
            if tensor.op.type != "VarHandleOp":
                return None
            handle = micro.node.add()
            handle.CopyFrom(tensor.op.node_def)
            handle.name, handle.device = f"tag_input_{k}", ""
            handle.attr["shared_name"].s = f"tag_input_{k}".encode()
            dtype = tf.dtypes.as_dtype(handle.attr["dtype"].type)
            shape = tf.TensorShape(handle.attr["shape"].shape)
            if not shape.is_fully_defined():
                return None
            value = micro.node.add(name=f"tag_init_{k}", op="Placeholder")
            value.attr["dtype"].type = dtype.as_datatype_enum
            value.attr["shape"].shape.CopyFrom(shape.as_proto())
            assign = micro.node.add(name=f"tag_assign_{k}", op="AssignVariableOp", input=[handle.name, value.name])
            assign.attr["dtype"].type = dtype.as_datatype_enum
            result.init_feeds[f"tag_init_{k}:0"] = _sample(shape.as_list(), dtype)
            result.init_ops.append(assign.name)
            signature.append((tuple(shape.as_list()), "variable", dtype.name))
            continue
        placeholder = micro.node.add(name=f"tag_input_{k}", op="Placeholder")
        placeholder.attr["dtype"].type = tensor.dtype.as_datatype_enum
        placeholder.attr["shape"].shape.CopyFrom(tensor.shape.as_proto())
        if tensor.shape.is_fully_defined():
            result.feeds[f"tag_input_{k}:0"] = _sample(tensor.shape.as_list(), tensor.dtype)
            signature.append((tuple(tensor.shape.as_list()), tensor.dtype.name))
        else:  # the step's value tells the shape; without it the pattern is not timed
            signature.append((None, tensor.dtype.name))
        if not tensor.dtype.is_floating or not tensor.shape.is_fully_defined():
            result.exact[name] = f"tag_input_{k}:0"
    renamed = {name: (f"tag_input_{k}" if graph.get_tensor_by_name(name).dtype == tf.resource else f"tag_input_{k}:0")
               for k, name in enumerate(external)}
    for op in ops:
        node = micro.node.add()
        node.CopyFrom(op.node_def)
        node.ClearField("input")
        for tensor in op.inputs:
            node.input.append(renamed.get(tensor.name, tensor.name))
        # Order among the pattern's own ops (a variable read after its update) stays; other control inputs go.
        node.input.extend("^" + c.name for c in op.control_inputs if c.name in members)
        node.device = ""
        if "_class" in node.attr:
            del node.attr["_class"]
    result.signature = tuple(signature)
    return result


def _sample(shape: list[int], dtype) -> np.ndarray:
    if dtype.is_floating:
        return np.random.default_rng(0).standard_normal(shape).astype(dtype.as_numpy_dtype) * 0.1 + 1.0
    # Zeros are valid indices, axes and flags for every integer or boolean input.
    return np.zeros(shape, dtype=dtype.as_numpy_dtype)


def _time_both(micro: _Micro, runs: int, most_runs: int = TUNE_RUNS_MAX) -> PairedTiming:
    """Runs as plain TF ops and as one XLA cluster, the two alternating: `runs` pairs, then `runs` more at a
    time while the saving is undecided, up to `most_runs`."""
    feeds, fetches = micro.feeds, micro.fetches
    sessions = [_session(micro.graph_def, xla=False), _session(micro.graph_def, xla=True)]
    try:
        for session in sessions:
            if micro.init_ops:
                session.run(micro.init_ops, feed_dict=micro.init_feeds)
            for _ in range(3):  # compile and warm up
                session.run(fetches, feed_dict=feeds)
        times: list[list[float]] = [[], []]
        while True:
            for _ in range(runs):
                for k, session in enumerate(sessions):
                    time.sleep(TUNE_GAP_S)
                    start = time.perf_counter()
                    session.run(fetches, feed_dict=feeds)
                    times[k].append(time.perf_counter() - start)
            low, saving, high = median_interval([plain - fused for plain, fused in zip(*times)])
            timing = PairedTiming(statistics.median(times[0]), statistics.median(times[1]), saving, low, high,
                                  len(times[0]))
            if not timing.undecided or timing.runs + runs > most_runs:
                return timing
    finally:
        for session in sessions:
            session.close()


def _session(graph_def, xla: bool):
    import tensorflow as tf

    graph_def = copy_graph_def(graph_def)
    if xla:
        for node in graph_def.node:
            if not node.name.startswith(("tag_input_", "tag_init_", "tag_assign_")):
                node.attr["_XlaCompile"].b = True
                node.attr["_XlaScope"].s = b"tune"
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    return tf.compat.v1.Session(graph=graph)
