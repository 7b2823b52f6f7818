"""Captured training steps on disk and in the store.

`capture_model` traces a model, writes its runnable GraphDef and step metadata
under `$TAG_HOME/captures/<model>/`, puts both under TAG_ARTIFACTS (tag_core.artifacts)
and stores the OpGraph, with the step's artifact addresses, in one transaction.
Later stages, on any worker, read these instead of tracing again.

Tracing runs in a child process (`python -m tag_core.capture`) whenever the spec
can be made again there from its reference: Keras and TF keep the model's and
optimizer's memory after the model is gone (2.3 GB for vgg19), so only the end
of a process gives it back. The child hands the OpGraph back as JSON records.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from tag_core import artifacts, store
from tag_core.files import write_atomically

from .graph import Edge, Op, OpGraph, Variable, capture, op_graph_from_json, records
from .load_check import CHILD_START_S, run_model_child
from .models import model_source_hash
from .models.spec import ModelSpec
from .time_limit import ENV, LONGEST_S, model_timeout
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
    """A stored step, runnable in a Session (no Keras objects, no shapes or flops). `meta_file` is an artifact
    address (what the store holds) or a local path (the capture folder, or an older TAG's store)."""
    import tensorflow as tf

    meta_file = artifacts.fetch(meta_file)
    meta = json.loads(meta_file.read_text())
    graph_file = meta["graph_file"]  # an address once published, a name beside the metadata before
    graph_path = artifacts.fetch(graph_file) if artifacts.is_address(graph_file) else meta_file.parent / graph_file
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(graph_path.read_bytes())
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


def publish_step(spec: ModelSpec, meta_file: Path) -> tuple[str, str]:
    """Put a traced step's GraphDef and metadata under TAG_ARTIFACTS, the metadata naming the GraphDef by
    its address, and point the step's ref at it; (graph address, metadata address)."""
    meta = json.loads(meta_file.read_text())
    graph_address = artifacts.put_file(meta_file.parent / meta["graph_file"])
    step_address = artifacts.put_bytes(json.dumps({**meta, "graph_file": graph_address}, indent=1).encode(),
                                       meta_file.name)
    artifacts.set_ref(_step_ref(spec, meta["batch_size"]), step_address)
    return graph_address, step_address


def _step_ref(spec: ModelSpec, batch: int) -> str:
    # By source hash: a worker never takes the step of another version of the model.
    return f"steps/{model_slug(spec.name)}/{model_source_hash(spec)}/b{batch}"


def capture_model(conn, spec: ModelSpec, batches: list[int] = ()) -> OpGraph:
    """Trace `spec`, write its step files (and those of `batches`, from the same build), publish them
    and store its OpGraph. Returns the OpGraph. In a child process when the spec can be made there (see
    `in_child`)."""
    folder = capture_folder(spec.name)
    if in_child(spec):
        result = _run_child(spec, folder, list(batches), capture=True)
        graph = op_graph_from_json(result["graph"])
    else:
        result = capture_here(spec, folder, list(batches))
        graph = result["graph"]
    for batch in dict.fromkeys(batches):
        if batch != spec.batch_size:
            publish_step(spec, folder / f"step_b{batch}.json")
    graph_address, step_address = publish_step(spec, Path(result["step_file"]))
    save_op_graph(conn, graph, result["source_hash"], graph_address, step_address)
    return graph


def in_child(spec: ModelSpec) -> bool:
    """Whether a child process can make `spec` again: resolve_model made it and it kept its reference's name
    (a hand-built spec, whose builder is a Python object, is traced here)."""
    return spec.reference is not None and spec.reference == spec.name


def capture_here(spec: ModelSpec, folder: Path, batches: list[int]) -> dict:
    """Capture `spec` in this process: {graph (an OpGraph), source_hash, graph_file, step_file}; the steps
    of `batches` are traced with the same build and written too."""
    captured = capture(spec)
    for stale in folder.glob("step_b*"):  # steps of an older version of the model
        stale.unlink()
    graph_file, meta_file = save_step(captured.step, folder)
    others = [b for b in dict.fromkeys(batches) if b != captured.step.batch_size]
    if others:
        from .trace import trace_step

        keras_objects = (captured.step.keras_model, captured.step.keras_optimizer)
        for batch in others:
            save_step(trace_step(spec, batch, keras_objects), folder)
    return {"graph": captured.graph, "source_hash": model_source_hash(spec), "graph_file": str(graph_file),
            "step_file": str(meta_file)}


def _run_child(spec: ModelSpec, folder: Path, batches: list[int], capture: bool) -> dict:
    """Run `python -m tag_core.capture` on `spec`; what it captured ({} when only tracing). Its input errors
    (timeouts included: it runs the model's code under the limits of its own main thread) come back as
    TagInputErrors; a hang its limits cannot cut (in C code) is killed at a generous backstop."""
    timeout = model_timeout(spec.timeout)
    # Build, two traces and each further batch under the limit, plus TF's start-up and the graph's analysis.
    backstop = min((3 + len(batches)) * timeout + 5 * CHILD_START_S, LONGEST_S)
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds tag_core
    env = {**os.environ, ENV: repr(timeout), "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    what = "capturing" if capture else "tracing"
    with tempfile.TemporaryDirectory(prefix="tag-capture-") as work:
        graph_out = Path(work) / "graph.json"
        job = {"model": spec.reference, "batch_size": spec.batch_size, "timeout": timeout, "folder": str(folder),
               "batches": batches, "graph_out": str(graph_out) if capture else None}
        job_file = Path(work) / "job.json"
        job_file.write_text(json.dumps(job))
        run_model_child([sys.executable, "-m", "tag_core.capture", str(job_file)], f"{what} {spec.name}",
                        backstop, timeout, env)
        return json.loads(graph_out.read_text()) if capture else {}


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


def ensure_captured(conn, spec: ModelSpec, batches: list[int] = ()) -> OpGraph:
    """The stored OpGraph, captured anew when missing, stale (model source changed) or at another batch size;
    a new capture also traces the steps of `batches` (see `capture_model`)."""
    record = store.captured_model(conn, spec.name)
    fresh = (
        record is not None
        and record["batch_size"] == spec.batch_size
        and record["source_hash"] == model_source_hash(spec)
        and record["step_file"]
        and artifacts.exists(record["step_file"])
    )
    if fresh:
        return load_op_graph(conn, spec.name)
    return capture_model(conn, spec, batches)


# Above this much variable state (model + optimizer), trace in a child process even when TF is loaded here.
CHILD_TRACE_BYTES = 256 * 2**20


def ensure_step_files(spec: ModelSpec, batch_sizes: list[int], state_bytes: int = 0) -> dict[int, Path]:
    """Step metadata files for each batch size: the capture folder's, else the published step's local copy,
    else traced here (and published).

    Tracing needs the Keras model and optimizer state in memory (1.7 GB for VGG19), which only the end of a
    process gives back. A child process traces unless the spec cannot be made there (`in_child`) or the model
    is small (`state_bytes` up to CHILD_TRACE_BYTES) and TF is loaded here already (no second start-up).
    """
    folder = capture_folder(spec.name)
    files = {batch: folder / f"step_b{batch}.json" for batch in batch_sizes}
    for batch, path in files.items():
        address = None if path.exists() else artifacts.get_ref(_step_ref(spec, batch))
        if address is not None and artifacts.exists(address):
            files[batch] = artifacts.fetch(address)
    missing = [batch for batch, path in files.items() if not path.exists()]
    if not missing:
        return files
    small_here = state_bytes <= CHILD_TRACE_BYTES and "tensorflow" in sys.modules
    if in_child(spec) and not small_here:
        _run_child(spec, folder, missing, capture=False)
    else:
        trace_batches(spec, missing, folder)
    for batch in missing:
        publish_step(spec, files[batch])
    return files


def trace_batches(spec: ModelSpec, batches: list[int], folder: Path) -> None:
    from .trace import build_keras, trace_step

    keras_objects = build_keras(spec)
    for batch in batches:
        save_step(trace_step(spec, batch, keras_objects), folder)
