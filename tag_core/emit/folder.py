"""The emission folder: graph, cluster spec, plan with what `tag run` needs, README, check references.

Written beside its destination and renamed into place, so it is never half there.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tag_core.errors import TagInputError

from .emission import Emission

EXACT_VALUES_LIMIT = 64 * 2**20  # initial values up to this size are stored exactly


def write_emission(emission: Emission, out: str | Path, force: bool = False,
                   prediction: dict[str, Any] | None = None) -> Path:
    """Write the emission folder atomically; an existing `out` needs `force`. `prediction` (the simulated
    step time of the emitted strategy, as `tag emit` makes it) goes into plan.json for `tag run --measure`."""
    from tag_core.capture.steps import save_step

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
        # str() is protobuf's C text encoder: 5x faster than text_format's Python printer (map keys unsorted).
        (work / "graph.pbtxt").write_text(str(graph_def))
        (work / "cluster.json").write_text(json.dumps(cluster_json(emission), indent=1))
        _, meta = save_step(emission.reference, work / "reference")
        statistics, partition = batch_statistics(emission), noise_partition(emission)
        for rows in set(statistics.get("rows") or ()) | set(partition.get("rows") or ()):  # sub-batch steps
            save_step(emission.traces[rows], work / "reference")
        exact = sum(v.nbytes for v in emission.initial_values.values()) <= EXACT_VALUES_LIMIT
        if exact:
            np.savez(work / "initial_values.npz", **{f"v{i}": emission.initial_values[v.name]
                                                      for i, v in enumerate(emission.reference.variables)})
        plan = plan_json(emission, meta.name, exact, statistics, partition)
        if prediction is not None:
            plan["prediction"] = prediction
        (work / "plan.json").write_text(json.dumps(plan, indent=1))
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


def noise_partition(emission: Emission) -> dict[str, Any]:
    """A split of the batch over which `tag run --check` also sums the single-device gradient: the same
    value in exact arithmetic, so where the two differ, float32 does not determine the gradient (the
    elements that data parallelism cannot be held to)."""
    split = [p for p in emission.placed.placements if p.kind == "split" and p.replicas > 1]
    if not split:
        return {}
    rows = list(split[0].batches)
    return {"rows": rows, "references": {str(b): f"reference/step_b{b}.json" for b in sorted(set(rows))}}


def plan_json(emission: Emission, reference_meta: str, exact_values: bool,
              statistics: dict[str, Any], partition: dict[str, Any]) -> dict[str, Any]:
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
            "noise_partition": partition,
            "rewrites_off": rewrites_off(emission),
        },
    }


def rewrites_off(emission: Emission) -> list[str]:
    """Grappler rewrites the session must turn off when the step has compiled regions (`regions.REWRITES_OFF`)."""
    from tag_core.fusion.regions import REWRITES_OFF

    return list(REWRITES_OFF) if (emission.fusion or {}).get("regions") else []


def readme(emission: Emission) -> str:
    s = emission.summary()
    kind = "GPU" if emission.device_kind == "gpu" else "CPU"
    machines = "\n".join(f"  task {k}: {m.name} ({m.count} x {m.gpu.name})" for k, m in enumerate(emission.topology.machines))
    off = rewrites_off(emission)
    rewrites = (f",\n  and graph_options.rewrite_options {', '.join(off)} off (inside an XLA region's function it "
                f"would make ops XLA cannot compile)" if off else "")
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
  allow_soft_placement (ops without a GPU kernel stay on the host){rewrites}.

Train the model with this plan on your data (checkpoints, resume, TensorBoard logs, a Keras model out):
  tag train {s['model']} --plan plan.json --data DATA --out RUN_DIR --epochs E
  (DATA: an .npz with one array per model input and `labels`, or path/to/file.py:function returning a
  tf.data.Dataset of (inputs, labels); on a real cluster add --cluster cluster.json --task-index K, as above).
  `tag train` emits the plan again into RUN_DIR/graph, so it takes the plan file `tag plan` wrote; this
  folder's plan.json serves `tag run`.

Batch norm: replicas of a split group normalise with their own sub-batch statistics, as standard
data parallelism does; the moving averages they update are the batch-share-weighted mean over replicas.
"""
