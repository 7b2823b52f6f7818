"""Emit the distributed TF training graph of a plan, with what it takes to run and check it.

`emit(spec, topology, strategy)` traces the step, places its ops (tag_core.emit.place)
and builds the GraphDef (tag_core.emit.graph); `write_emission(...)` (tag_core.emit.folder) writes a folder:

    graph.pb, graph.pbtxt   the distributed step (feeds: the model inputs and label, whole batch;
                            fetch tag/loss and run tag/train per step; tag_init/all after feeding
                            tag_init/value_i with each variable's initial value)
    cluster.json            TF ClusterSpec, one worker task per machine, and each task's devices
    plan.json               strategy, lineage, and what `tag run` needs (feeds, variables, collectives)
    README.txt              how to run it on a real cluster
    reference/              the single-device step, for `tag run --check`
    initial_values.npz      initial variable values (small models; others get seeded values at run time)

The folder is written beside its destination and renamed into place: it is never half there.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tag_core.capture.graph import OpGraph, build_op_graph
from tag_core.capture.models.spec import ModelSpec
from tag_core.capture.trace import TracedStep
from tag_core.cluster.topology import Topology
from tag_core.errors import TagInputError
from tag_core.files import input_file, read_json
from tag_core.simulate.strategy import Strategy

from .emission import Emission
from .folder import write_emission
from .graph import GraphBuilder
from .place import device_names, place_ops

DEVICE_KINDS = ("gpu", "cpu")
INIT_SEED = 20240601  # Keras' initialisers draw from this seed: emissions are reproducible


def resolve_strategy(text: str, graph: OpGraph, topology: Topology, batch_size: int, profiles=None) -> Strategy:
    """A baseline (dp-nccl, dp-nccl-p, horovod, single), an option applied to every op on every
    device (allreduce, ps, duplicate, model_parallel), or a strategy/plan JSON file."""
    from tag_core.search.strategy_files import load_strategy
    from tag_core.simulate.simulator import Simulator

    return load_strategy(text, Simulator(graph, topology, profiles, batch_size=batch_size))


def check_lineage(plan: dict[str, Any], graph: OpGraph, topology: Topology, model: str) -> None:
    """A plan must be for this model, this captured graph and this topology snapshot."""
    lineage = {**plan, **(plan.get("lineage") or {})}
    if plan.get("model") not in (None, model):
        raise TagInputError("--plan", f"was made for model {plan['model']!r}, not {model!r}")
    graph_hash = lineage.get("graph_hash")
    if graph_hash and graph_hash != graph.content_hash():
        raise TagInputError("--plan", f"was made for another graph of {model} (graph hash {graph_hash}, the "
                                      f"current capture has {graph.content_hash()}); plan again")
    topology_hash = lineage.get("topology_hash")
    if topology_hash and topology_hash != topology.content_hash():
        raise TagInputError("--plan", f"was made for another topology (hash {topology_hash}; {topology.name} "
                                      f"has {topology.content_hash()}); plan again or pass the plan's topology")


StrategySource = Strategy | str | Callable[[OpGraph, Topology], Strategy]


def emit(spec: ModelSpec, topology: Topology, strategy: StrategySource, device_kind: str = "gpu",
         plan: dict[str, Any] | None = None, profiles=None, fusion=None) -> Emission:
    """Trace `spec`, check the plan's lineage, and build the distributed step for `strategy`: a Strategy,
    a name (see `resolve_strategy`), or a function of the captured OpGraph and the topology.
    With `fusion` (a FusionPlan, or a function of the captured OpGraph and the step returning one), each
    copy of each fused pattern is marked as one XLA cluster and each region on a device compiled as one function
    call (`fusion.mark_emitted_for_xla`)."""
    from tag_core.capture.traces import model_traces

    if device_kind not in DEVICE_KINDS:
        raise TagInputError("--device-kind", f"must be one of {', '.join(DEVICE_KINDS)}, got {device_kind!r}")
    start = time.perf_counter()
    captured_batch = spec.batch_size
    batch = int((plan or {}).get("batch_size") or captured_batch)
    model = model_traces(spec, INIT_SEED)
    traces: dict[int, TracedStep] = {}

    def traced(b: int) -> TracedStep:
        if b not in traces:
            traces[b] = model.at(b)
        return traces[b]

    graph = build_op_graph(traced(captured_batch), traced(captured_batch + 1))
    if plan is not None:
        check_lineage(plan, graph, topology, spec.name)
    if isinstance(strategy, str):
        strategy = resolve_strategy(strategy, graph, topology, batch, profiles)
    elif callable(strategy):
        strategy = strategy(graph, topology)
    placed = place_ops(graph, topology, strategy, profiles, batch)
    kept = {op.name for op in graph.ops}
    for pid, p in enumerate(placed.placements):
        if p.kind == "split":
            rows = _traceable_rows(list(p.batches), lambda b: kept <= {n.name for n in traced(b).graph_def.node})
            if tuple(rows) != p.batches:
                placed.notes.append(f"rows {list(p.batches)} became {rows}: the step traced at "
                                    f"{sorted(set(p.batches) - set(rows))} rows has other ops")
                placed.placements[pid] = dataclasses.replace(p, batches=tuple(rows))
    used = {b for p in placed.placements for b in p.batches} | {batch, batch + 1}  # batch + 1: the probe
    used_traces = {b: traced(b) for b in sorted(used)}
    machines = [d.machine for d in topology.devices]
    builder = GraphBuilder(used_traces, batch, graph, placed, device_names(topology, device_kind), machines,
                           fusion_bytes=int(strategy.fusion_bytes))
    emitted = builder.build()
    fused = None
    if fusion is not None:
        from tag_core.fusion.xla_marks import mark_emitted_for_xla

        fusion = fusion(graph, traced(captured_batch)) if callable(fusion) else fusion
        fused = mark_emitted_for_xla(emitted.graph_def, fusion, [emitted.loss_tensor, emitted.train_op, emitted.init_op])
    check_imports(emitted.graph_def)
    values = _initial_values(traces[batch], model.keras_objects)
    notes = list(placed.notes)
    if builder.seed is None and any(p.kind == "split" for p in placed.placements):
        raise TagInputError("model", f"{spec.name}: cannot find the gradient seed of the step; split placements "
                                     f"need it to weight each replica's gradient")
    lineage = {"graph_hash": graph.content_hash() if batch == captured_batch else None,
               "topology_hash": topology.content_hash(), **({} if plan is None else plan.get("lineage") or {})}
    return Emission(spec=spec, topology=topology, strategy=strategy, device_kind=device_kind, batch_size=batch,
                    graph=graph, placed=placed, emitted=emitted, reference=traces[batch], traces=used_traces,
                    initial_values=values,
                    lineage=lineage, seconds=time.perf_counter() - start, notes=notes, fusion=fused)


def _traceable_rows(rows: list[int], traceable: Callable[[int], bool]) -> list[int]:
    """Rows per replica whose traces have the step's ops: a size that traces differently (Keras takes
    other paths at batch 1) gets a row from the largest replica until every size is fine."""
    rows = list(rows)
    for _ in range(sum(rows)):
        bad = [i for i, r in enumerate(rows) if not traceable(r)]
        if not bad:
            return rows
        donor = max(range(len(rows)), key=lambda j: (rows[j], -j))
        if donor == bad[0] or rows[donor] <= 1:
            break
        rows[bad[0]] += 1
        rows[donor] -= 1
    raise TagInputError("plan", f"no split of the batch near {rows} traces to the same ops as the whole batch; "
                                f"use fewer replicas or a larger batch")


def check_imports(graph_def) -> None:
    """TF must import what was built (names, inputs, attributes); anything else is an emitter bug.

    TF's C++ importer does all of that checking; the Python `import_graph_def` then wraps every op in a
    Python object, 95% of its time on big graphs (13 s of 14 at 26,000 ops), which this check has no use for."""
    import tensorflow as tf

    try:
        _import_in_cpp(graph_def)
    except (ValueError, tf.errors.OpError) as exc:
        raise RuntimeError(f"the emitted graph does not import into TensorFlow: {exc}") from exc


def _import_in_cpp(graph_def) -> None:
    import tensorflow as tf

    try:  # private API of the pinned TF: fall back to the public import if it moves
        from tensorflow.python.client import pywrap_tf_session as c_api
        from tensorflow.python.framework import c_api_util
        new_buffer, import_with_results = c_api.TF_NewBufferFromString, c_api.TF_GraphImportGraphDefWithResults
    except (ImportError, AttributeError):
        with tf.Graph().as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
        return
    graph = tf.Graph()
    options = c_api_util.ScopedTFImportGraphDefOptions()
    buffer = new_buffer(graph_def.SerializeToString())
    try:
        with graph._c_graph.get() as c_graph:
            c_api_util.ScopedTFImportGraphDefResults(import_with_results(c_graph, buffer, options.options))
    finally:
        c_api.TF_DeleteBuffer(buffer)


def _initial_values(step: TracedStep, keras_objects) -> dict[str, np.ndarray]:
    model, optimizer = keras_objects
    by_path = {getattr(v, "path", v.name): v for v in [*model.variables, *optimizer.variables]}
    return {v.name: np.asarray(by_path[v.name].numpy()) for v in step.variables}


# ---- one call from arguments (the CLI and the Dagster asset) ---------------------


def read_plan(path: str | Path) -> tuple[dict[str, Any], Strategy]:
    path = input_file(path, "--plan")
    plan = read_json(path, "--plan")
    if not isinstance(plan, dict):
        raise TagInputError("--plan", f"{path} must hold a JSON object")
    try:
        return plan, plan_strategy(plan)
    except TagInputError as exc:
        raise TagInputError(f"--plan {path}: {exc.where}", exc.problem) from None


def plan_strategy(plan: dict[str, Any]) -> Strategy:
    """The strategy a plan embeds (a bare strategy object is accepted too)."""
    # Strategy.from_dict does not unwrap `tag plan` output: its top-level "groups" is a count.
    embedded = plan.get("strategy")
    return Strategy.from_dict(embedded if isinstance(embedded, dict) else plan)


def plan_topology(plan: dict[str, Any], topology: Topology | None) -> Topology:
    """The topology to emit for: the one given, else the snapshot the plan carries."""
    from tag_core.cluster.topology_json import parse_topology

    if topology is not None:
        return topology
    if "topology_snapshot" in plan:  # as `tag plan` writes: checked against its hash
        from tag_core.plan.plan_file import check_plan_file

        return check_plan_file(plan, "--plan").topology
    embedded = plan.get("topology")
    if isinstance(embedded, dict):
        return parse_topology(embedded, "plan topology")
    if embedded is None:  # a bare strategy file names no topology at all
        raise TagInputError("--topology",
                            "the plan names no topology and carries no snapshot; pass one with --topology")
    raise TagInputError("--topology", f"the plan names topology {embedded!r} but does not include it; "
                                      f"pass its snapshot with --topology")


def emit_folder(spec: ModelSpec, out: str | Path, topology: Topology | None, strategy: str | None = None,
                plan: dict[str, Any] | None = None, device_kind: str = "gpu", force: bool = False,
                profiles=None, fusion=None) -> Emission:
    """Emit for a plan (dict, as `tag plan` writes it) or a named strategy, and write `out`."""
    out = Path(out)
    if out.exists() and not force:  # before any tracing: fail fast
        raise TagInputError("--out", f"{out} exists; pass --force to replace it")
    if plan is not None:
        try:
            chosen: Strategy | str = plan_strategy(plan)
        except TagInputError as exc:
            raise TagInputError(f"--plan: {exc.where}", exc.problem) from None
        topology = plan_topology(plan, topology)
    elif strategy is None or topology is None:
        raise TagInputError("--strategy", "give --plan, or --topology with --strategy")
    else:
        chosen = strategy
    emission = emit(spec, topology, chosen, device_kind, plan=plan, profiles=profiles, fusion=fusion)
    write_emission(emission, out, force=force)
    return emission
