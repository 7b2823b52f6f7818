"""Captured training steps on disk and in the store.

`capture_model` traces a model, writes its runnable GraphDef and step metadata
under `$TAG_HOME/captures/<model>/`, and stores the OpGraph in DuckDB in one
transaction. Later stages read these instead of tracing again.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict
from pathlib import Path

from . import store
from .files import write_atomically
from .graph import OpGraph, capture
from .models import ModelSpec, model_source_hash
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


def capture_model(conn, spec: ModelSpec) -> OpGraph:
    """Trace `spec`, write its step files, and store its OpGraph. Returns the OpGraph."""
    captured = capture(spec)
    # Absolute: a Dagster run worker may start in another directory.
    folder = (store.tag_home() / "captures" / model_slug(spec.name)).resolve()
    graph_file, meta_file = save_step(captured.step, folder)
    store.save_op_graph(conn, captured.graph, model_source_hash(spec), str(graph_file), str(meta_file))
    return captured.graph


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
        return store.load_op_graph(conn, spec.name)
    return capture_model(conn, spec)
