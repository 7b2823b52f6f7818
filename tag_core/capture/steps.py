"""Captured training steps on disk and in the store.

`capture_model` traces a model, writes its runnable GraphDef and step metadata
under `$TAG_HOME/captures/<model>/`, and stores the OpGraph in DuckDB in one
transaction. Later stages read these instead of tracing again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from tag_core import store
from tag_core.files import write_atomically

from .graph import Edge, Op, OpGraph, Variable, capture, records
from .load_check import child_error
from .models import model_source_hash
from .models.spec import ModelSpec
from .time_limit import ENV, model_timeout
from .trace import TracedStep, TracedVariable


def model_slug(model: str) -> str:
    """A file-system-safe folder name for a model reference."""
    readable = re.sub(r"[^A-Za-z0-9_.=-]+", "_", model).strip("_")[-60:]
    return f"{readable}-{hashlib.sha1(model.encode()).hexdigest()[:8]}"


def save_step(step: TracedStep, folder: Path) -> tuple[Path, Path]:
    graph_file = folder / f"step_b{step.batch_size}.pb"
    meta_file = folder / f"step_b{step.batch_size}.json"
    write_atomically(graph_file, step.graph_def.SerializeToString())
    meta = {
        "model": step.model,
        "batch_size": step.batch_size,
        "input_tensors": step.input_tensors,
        "loss_tensor": step.loss_tensor,
        "train_ops": step.train_ops,
        "init_op": step.init_op,
        "variables": [asdict(v) for v in step.variables],
        "graph_file": graph_file.name,
    }
    write_atomically(meta_file, json.dumps(meta, indent=1).encode())
    return graph_file, meta_file


def load_step(meta_file: str | Path) -> TracedStep:
    """A stored step, runnable in a Session (no Keras objects, no shapes or flops)."""
    import tensorflow as tf

    meta_file = Path(meta_file)
    meta = json.loads(meta_file.read_text())
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString((meta_file.parent / meta["graph_file"]).read_bytes())
    variables = [TracedVariable(**{**v, "shape": tuple(v["shape"])}) for v in meta["variables"]]
    return TracedStep(
        model=meta["model"],
        batch_size=meta["batch_size"],
        graph_def=graph_def,
        input_tensors=meta["input_tensors"],
        loss_tensor=meta["loss_tensor"],
        train_ops=meta["train_ops"],
        init_op=meta["init_op"],
        variables=variables,
        output_shapes={},
        flops={},
    )


def capture_folder(model: str) -> Path:
    # Absolute: a Dagster run worker may start in another directory.
    return (store.tag_home() / "captures" / model_slug(model)).resolve()


def capture_model(conn, spec: ModelSpec) -> OpGraph:
    """Trace `spec`, write its step files, and store its OpGraph. Returns the OpGraph."""
    captured = capture(spec)
    folder = capture_folder(spec.name)
    for stale in folder.glob("step_b*"):  # steps of an older version of the model
        stale.unlink()
    graph_file, meta_file = save_step(captured.step, folder)
    save_op_graph(conn, captured.graph, model_source_hash(spec), str(graph_file), str(meta_file))
    return captured.graph


def save_op_graph(conn, graph: OpGraph, source_hash: str | None, graph_file: str | None, step_file: str | None) -> None:
    """Store `graph` (tables models, ops, edges, variables), replacing the model's previous graph."""
    model = {"model": graph.model, "batch_size": graph.batch_size, "source_hash": source_hash,
             "graph_hash": graph.content_hash(), "graph_file": graph_file, "step_file": step_file,
             "summary": graph.summary()}
    store.save_op_graph(conn, model, records(graph.ops), records(graph.edges), records(graph.variables))


def load_op_graph(conn, model: str) -> OpGraph:
    """The stored OpGraph of a captured model; TagInputError naming the model when it was never captured."""
    record, ops, edges, variables = store.op_graph_rows(conn, model)
    return OpGraph(model=model, batch_size=record["batch_size"], ops=[Op(*row) for row in ops],
                   edges=[Edge(*row) for row in edges], variables=[Variable(*row) for row in variables])


def ensure_captured(conn, spec: ModelSpec) -> OpGraph:
    """The stored OpGraph, captured anew when missing, stale (model source changed) or at another batch size."""
    record = store.captured_model(conn, spec.name)
    fresh = (
        record is not None
        and record["batch_size"] == spec.batch_size
        and record["source_hash"] == model_source_hash(spec)
        and record["step_file"]
        and Path(record["step_file"]).exists()
    )
    if fresh:
        return load_op_graph(conn, spec.name)
    return capture_model(conn, spec)


# Above this much variable state (model + optimizer), trace in a child process.
CHILD_TRACE_BYTES = 256 * 2**20


def ensure_step_files(spec: ModelSpec, batch_sizes: list[int], state_bytes: int = 0) -> dict[int, Path]:
    """Step metadata files for each batch size, tracing the missing ones.

    Tracing needs the Keras model and optimizer state in memory (1.7 GB for
    VGG19). For big models (`state_bytes` over CHILD_TRACE_BYTES) a child
    process traces, and gives all of it back before anything runs; small
    models trace in this process and skip a second TF start-up.
    """
    folder = capture_folder(spec.name)
    files = {batch: folder / f"step_b{batch}.json" for batch in batch_sizes}
    missing = [batch for batch, path in files.items() if not path.exists()]
    if missing and state_bytes <= CHILD_TRACE_BYTES:
        trace_batches(spec, missing, folder)
    elif missing:
        command = [sys.executable, "-m", "tag_core.capture", spec.name, str(spec.batch_size), str(folder),
                   ",".join(map(str, missing))]
        env = {**os.environ, ENV: repr(model_timeout(spec.timeout))}  # the child loads under this one's limit
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            error = child_error(result.stderr)
            if error is not None:
                raise error
            raise RuntimeError(f"tracing {spec.name} failed:\n{result.stderr[-3000:]}")
    return files


def trace_batches(spec: ModelSpec, batches: list[int], folder: Path) -> None:
    from .trace import build_keras, trace_step

    keras_objects = build_keras(spec)
    for batch in batches:
        save_step(trace_step(spec, batch, keras_objects), folder)
