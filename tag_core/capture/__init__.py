"""The first stage: a model reference becomes a training step and its op graph.

In: a model reference (a zoo name with options, or `path/to/file.py:function`) and a batch size.
Out: a `ModelSpec`; the traced step (`TracedStep`: a runnable GraphDef with its variables); the
`OpGraph` (ops with bytes, flops and flags; edges with bytes and whether they carry the batch),
stored in DuckDB and as step files under `$TAG_HOME/captures/`.
"""

from .graph import Capture, Edge, Op, OpGraph, Variable, build_op_graph, capture
from .models import BENCHMARK_MODELS, ZOO, model_source_hash, resolve_model, split_models, zoo_defaults
from .models.spec import InputSpec, ModelSpec
from .registry import RegisteredModel, load_registry, registry_path
from .steps import (
    capture_folder,
    capture_model,
    ensure_captured,
    ensure_step_files,
    load_op_graph,
    load_step,
    save_op_graph,
    save_step,
)
from .trace import TracedStep, TracedVariable, synthetic_batch, trace_step

__all__ = [
    "BENCHMARK_MODELS", "Capture", "Edge", "InputSpec", "ModelSpec", "Op", "OpGraph", "RegisteredModel",
    "TracedStep", "TracedVariable", "Variable", "ZOO", "build_op_graph", "capture", "capture_folder",
    "capture_model", "ensure_captured", "ensure_step_files", "load_op_graph", "load_registry", "load_step",
    "model_source_hash", "registry_path", "resolve_model", "save_op_graph", "save_step", "split_models",
    "synthetic_batch", "trace_step", "zoo_defaults",
]
