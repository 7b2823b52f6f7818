"""Emit the distributed TF training graph of a plan, with what it takes to run and check it.

`emit(spec, topology, strategy)` traces the step, places its ops (tag_core.emit_place)
and builds the GraphDef (tag_core.emit_graph); `write_emission(...)` writes a folder:

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
import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .emit_graph import EmittedGraph, GraphBuilder
from .emit_place import OpPlacements, device_names, place_ops
from .errors import TagInputError
from .graph import OpGraph, build_op_graph
from .models import ModelSpec
from .strategy import OPTIONS, Strategy
from .topology import Topology
from .trace import TracedStep

DEVICE_KINDS = ("gpu", "cpu")
EXACT_VALUES_LIMIT = 64 * 2**20  # initial values up to this size are stored exactly
INIT_SEED = 20240601  # Keras' initialisers draw from this seed: emissions are reproducible


@dataclass
class Emission:
    spec: ModelSpec
    topology: Topology
    strategy: Strategy
    device_kind: str
    batch_size: int
    graph: OpGraph
    placed: OpPlacements
    emitted: EmittedGraph
    reference: TracedStep  # the single-device step at the same batch
    traces: dict[int, TracedStep]  # the step at every batch size the copies use
    initial_values: dict[str, np.ndarray]
    lineage: dict[str, Any]
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def devices(self) -> list[str]:
        return device_names(self.topology, self.device_kind)

    def summary(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for p in self.placed.placements:
            kinds[p.kind] = kinds.get(p.kind, 0) + 1
        return {
            "model": self.spec.name,
            "topology": self.topology.name,
            "strategy": self.strategy.name or "plan",
            "device_kind": self.device_kind,
            "batch_size": self.batch_size,
            "single_device_ops": len(self.reference.graph_def.node),
            "emitted_ops": len(self.emitted.graph_def.node),
            "collectives": len(self.emitted.collectives),
            "placements": kinds,
            "emit_seconds": round(self.seconds, 3),
        }


def resolve_strategy(text: str, graph: OpGraph, topology: Topology, batch_size: int, profiles=None) -> Strategy:
    """A baseline (dp-nccl, dp-nccl-p, horovod, single), an option applied to every op on every
    device (allreduce, ps, duplicate, model_parallel), or a strategy/plan JSON file."""
    from .simulate import Simulator

    option = text.lower().replace("-", "_")
    if option in OPTIONS:
        return Strategy.uniform(len(graph.ops), topology.num_machines, topology.num_devices, option, name=option)
    from .commands.simulate import load_strategy

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
         plan: dict[str, Any] | None = None, profiles=None) -> Emission:
    """Trace `spec`, check the plan's lineage, and build the distributed step for `strategy`: a Strategy,
    a name (see `resolve_strategy`), or a function of the captured OpGraph and the topology."""
    import keras

    from .trace import build_keras, trace_step

    if device_kind not in DEVICE_KINDS:
        raise TagInputError("--device-kind", f"must be one of {', '.join(DEVICE_KINDS)}, got {device_kind!r}")
    start = time.perf_counter()
    captured_batch = spec.batch_size
    batch = int((plan or {}).get("batch_size") or captured_batch)
    keras.utils.set_random_seed(INIT_SEED)
    keras_objects = build_keras(spec)
    traces: dict[int, TracedStep] = {}

    def traced(b: int) -> TracedStep:
        if b not in traces:
            traces[b] = trace_step(spec, b, keras_objects)
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
    builder = GraphBuilder(used_traces, batch, graph, placed, device_names(topology, device_kind), machines)
    emitted = builder.build()
    check_imports(emitted.graph_def)
    values = _initial_values(traces[batch], keras_objects)
    notes = list(placed.notes)
    if builder.seed is None and any(p.kind == "split" for p in placed.placements):
        raise TagInputError("model", f"{spec.name}: cannot find the gradient seed of the step; split placements "
                                     f"need it to weight each replica's gradient")
    lineage = {"graph_hash": graph.content_hash() if batch == captured_batch else None,
               "topology_hash": topology.content_hash(), **({} if plan is None else plan.get("lineage") or {})}
    return Emission(spec=spec, topology=topology, strategy=strategy, device_kind=device_kind, batch_size=batch,
                    graph=graph, placed=placed, emitted=emitted, reference=traces[batch], traces=used_traces,
                    initial_values=values,
                    lineage=lineage, seconds=time.perf_counter() - start, notes=notes)


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
    """TF must import what was built (names, inputs, attributes); anything else is an emitter bug."""
    import tensorflow as tf

    try:
        with tf.Graph().as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
    except (ValueError, tf.errors.OpError) as exc:
        raise RuntimeError(f"the emitted graph does not import into TensorFlow: {exc}") from exc


def _initial_values(step: TracedStep, keras_objects) -> dict[str, np.ndarray]:
    model, optimizer = keras_objects
    by_path = {getattr(v, "path", v.name): v for v in [*model.variables, *optimizer.variables]}
    return {v.name: np.asarray(by_path[v.name].numpy()) for v in step.variables}


# ---- files ----------------------------------------------------------------------


def write_emission(emission: Emission, out: str | Path, force: bool = False) -> Path:
    """Write the emission folder atomically; an existing `out` needs `force`."""
    from google.protobuf import text_format

    from .captures import save_step

    out = Path(out)
    if out.exists() and not force:
        raise TagInputError("--out", f"{out} exists; pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise TagInputError("--out", f"{out} exists and is not a directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        graph_def = emission.emitted.graph_def
        (work / "graph.pb").write_bytes(graph_def.SerializeToString())
        (work / "graph.pbtxt").write_text(text_format.MessageToString(graph_def))
        (work / "cluster.json").write_text(json.dumps(cluster_json(emission), indent=1))
        _, meta = save_step(emission.reference, work / "reference")
        statistics = batch_statistics(emission)
        for rows in set(statistics.get("rows") or ()):  # the per-sub-batch reference's steps
            save_step(emission.traces[rows], work / "reference")
        exact = sum(v.nbytes for v in emission.initial_values.values()) <= EXACT_VALUES_LIMIT
        if exact:
            np.savez(work / "initial_values.npz", **{f"v{i}": emission.initial_values[v.name]
                                                      for i, v in enumerate(emission.reference.variables)})
        (work / "plan.json").write_text(json.dumps(plan_json(emission, meta.name, exact, statistics), indent=1))
        (work / "README.txt").write_text(readme(emission))
        _swap_in(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out


def _swap_in(work: Path, out: Path) -> None:
    if out.exists():
        old = out.with_name(f".{out.name}.old-{time.time_ns()}")
        out.rename(old)
        work.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        work.rename(out)


def cluster_json(emission: Emission) -> dict[str, Any]:
    local = emission.device_kind == "cpu"
    addresses = [f"127.0.0.1:{2222 + k}" if local else f"{m.name}:2222" for k, m in enumerate(emission.topology.machines)]
    devices = emission.devices
    tasks = [{"task": k, "machine": m.name, "gpu": m.gpu.name, "address": addresses[k],
              "devices": [devices[d.index] for d in emission.topology.devices if d.machine == k]}
             for k, m in enumerate(emission.topology.machines)]
    return {"cluster": {"worker": addresses}, "tasks": tasks}


def batch_statistics(emission: Emission) -> dict[str, Any]:
    """How `tag run --check` treats batch statistics computed per replica (batch norm): against the
    single-device step run on each replica's rows and combined like the replicas, or not at all."""
    e = emission.emitted
    if not e.stat_ops:
        return {}
    info: dict[str, Any] = {"ops": e.stat_ops, "writes": e.stat_writes}
    shapes = emission.reference.output_shapes
    sparse = [v.name for v in emission.reference.variables if v.gradient and
              tuple(shapes[v.gradient.split(":")[0]][int(v.gradient.split(":")[1])][0]) != tuple(v.shape)]
    if isinstance(e.stat_rows, str):
        info["skip"] = e.stat_rows
    elif sparse:
        info["skip"] = f"sparse gradients ({', '.join(sparse[:3])}) cannot be combined over sub-batches"
    else:
        info["rows"] = list(e.stat_rows)
        info["references"] = {str(b): f"reference/step_b{b}.json" for b in sorted(set(e.stat_rows))}
    return info


def plan_json(emission: Emission, reference_meta: str, exact_values: bool,
              statistics: dict[str, Any]) -> dict[str, Any]:
    e, spec = emission.emitted, emission.spec
    variables = []
    for i, v in enumerate(emission.reference.variables):
        value = emission.initial_values[v.name]
        entry: dict[str, Any] = {"name": v.name, "shape": list(v.shape), "dtype": v.dtype, "owner": v.owner,
                                 "trainable": v.trainable, "copies": [list(c) for c in e.variable_copies[v.name]]}
        if exact_values:
            entry["init"] = {"npz": f"v{i}"}
        elif value.size and np.all(value == value.flat[0]):
            entry["init"] = {"fill": value.flat[0].item()}
        else:
            entry["init"] = {"normal": [float(value.mean()), float(value.std())], "seed": i}
        variables.append(entry)
    inputs = [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype, "max_value": s.max_value}
              for s in [*spec.inputs, spec.label]]
    devices = emission.devices
    return {
        "model": spec.name,
        "topology": emission.topology.name,
        "batch_size": emission.batch_size,
        "strategy": emission.strategy.to_dict(),
        "lineage": emission.lineage,
        "summary": emission.summary(),
        "notes": emission.notes,
        "emission": {
            "device_kind": emission.device_kind,
            "tasks": [m.count for m in emission.topology.machines],
            "inputs": inputs,
            "input_tensors": e.input_tensors,
            "loss_tensor": e.loss_tensor,
            "train_op": e.train_op,
            "init_op": e.init_op,
            "init_values": e.init_values,
            "variables": variables,
            "reference": f"reference/{reference_meta}",
            "collectives": [{"node": c.node, "device": c.device, "tensor": c.tensor, "group_key": c.group_key,
                             "instance_key": c.instance_key, "group": c.group} for c in e.collectives],
            "placements": [p.describe(devices) for p in emission.placed.placements],
            "batch_statistics": statistics,
        },
    }


def readme(emission: Emission) -> str:
    s = emission.summary()
    kind = "GPU" if emission.device_kind == "gpu" else "CPU"
    machines = "\n".join(f"  task {k}: {m.name} ({m.count} x {m.gpu.name})" for k, m in enumerate(emission.topology.machines))
    return f"""TAG distributed training step for {s['model']} on {s['topology']} ({s['strategy']})
Global batch {s['batch_size']}; {s['emitted_ops']} ops (the single-device step has {s['single_device_ops']}),
{s['collectives']} collective ops. Devices are /job:worker/task:K/device:{kind}:i, one task per machine:
{machines}

Run it here (local TF servers on 127.0.0.1, logical CPU devices), comparing every step with the
single-device step:
  tag run {'<this folder>'} --steps 5 --check

Run it on a real cluster:
  1. Put each machine's host:port in cluster.json ("cluster": {{"worker": [...]}}, task K = machine K).
  2. On every machine K (K > 0):  tag run <this folder> --cluster cluster.json --task-index K
     It serves its devices until stopped.
  3. On machine 0:               tag run <this folder> --cluster cluster.json --task-index 0 --steps N
     Task 0 is the client: it feeds the whole batch and runs the steps (in-graph replication).
  Sessions use ConfigProto.experimental.collective_group_leader = /job:worker/replica:0/task:0 and
  allow_soft_placement (ops without a GPU kernel stay on the host).

From your own code (TF 2.x, v1 API):
  tf.compat.v1.import_graph_def(graph_def, name="")
  feed tag_init/value_i:0 with variable i's initial value (order: plan.json emission.variables), run tag_init/all;
  per step feed {', '.join(emission.emitted.input_tensors)} with the whole batch and run
  [tag/loss:0, tag/train].

Batch norm: replicas of a split group normalise with their own sub-batch statistics, as standard
data parallelism does; the moving averages they update are the batch-share-weighted mean over replicas.
"""


# ---- one call from arguments (the CLI and the Dagster asset) ---------------------


def read_plan(path: str | Path) -> tuple[dict[str, Any], Strategy]:
    path = Path(path)
    if not path.is_file():
        raise TagInputError("--plan", f"{path} does not exist")
    try:
        plan = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise TagInputError("--plan", f"{path} is not valid JSON: {exc}") from None
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
    """The topology to emit for: the one given, else one the plan embeds."""
    from .topology import parse_topology

    if topology is not None:
        return topology
    embedded = plan.get("topology")
    if isinstance(embedded, dict):
        return parse_topology(embedded, "plan topology")
    raise TagInputError("--topology", f"the plan names topology {embedded!r} but does not include it; "
                                      f"pass its snapshot with --topology")


def emit_folder(spec: ModelSpec, out: str | Path, topology: Topology | None, strategy: str | None = None,
                plan: dict[str, Any] | None = None, device_kind: str = "gpu", force: bool = False,
                profiles=None) -> Emission:
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
    emission = emit(spec, topology, chosen, device_kind, plan=plan, profiles=profiles)
    write_emission(emission, out, force=force)
    return emission
