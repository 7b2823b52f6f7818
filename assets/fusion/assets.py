"""Fusion plans of memory-intensive ops per model (FusionStitching), kernel counts and measured times."""

# No `from __future__ import annotations`: Dagster checks the `context` annotation
# as a real type and rejects the string form.

import hashlib
import json

from dagster import AssetExecutionContext, Config, DataVersion, MaterializeResult, MetadataValue, asset
from dagster_duckdb import DuckDBResource
from pydantic import Field

from tag_core import store
from tag_core.capture import load_op_graph, resolve_model
from tag_core.cluster import lookup_gpu
from tag_core.fusion import fuse_model
from tag_pipelines.errors import input_errors_as_failures
from tag_pipelines.partitions import model_partitions
from tag_pipelines.resources import open_store

from ..capture import training_graph


class FusionConfig(Config):
    gpu: str = Field(default="V100-32GB", description="Catalog GPU the plan is scored for.")
    tune: bool = Field(default=True, description="Time every pattern with XLA here and keep the winners.")
    measure: bool = Field(default=True, description="Time the step with no XLA, auto-clustering, jit and TAG's plan.")
    steps: int = Field(default=5, description="Timed steps per mode when measuring.")
    regions: bool = Field(default=True, description="Let tuning propose compiled regions (compute ops as "
                                                    "library calls inside XLA programs).")


@asset(partitions_def=model_partitions, deps=[training_graph], group_name="fusion", kinds={"tensorflow", "duckdb"})
def fusion_plan(context: AssetExecutionContext, duckdb: DuckDBResource, config: FusionConfig) -> MaterializeResult:
    """Fused patterns of memory-intensive ops; plans made after it see fused costs."""
    with input_errors_as_failures():
        spec = resolve_model(context.partition_key)
        gpu = lookup_gpu(config.gpu, "gpu")
        with open_store(duckdb) as conn:
            graph = load_op_graph(conn, spec.name)
            step_file = store.captured_model(conn, spec.name)["step_file"]
        plan = fuse_model(spec, graph, step_file, gpu, tune=config.tune, measure=config.measure, steps=config.steps,
                          regions=config.regions)
        data = plan.to_json()
        with open_store(duckdb) as conn:
            store.save_fusion_plan(conn, spec.name, graph.content_hash(), data)
    metadata = {
        "patterns": len(plan.patterns),
        "ops_fused": plan.ops_fused,
        "kernels_before": plan.kernels_before,
        "kernels_after": plan.kernels_after,
        "compiled_regions": len(plan.regions),
        "estimated_saving_ms": plan.saved_s * 1e3,
        "reference_gpu": plan.reference_gpu,
    }
    if "step_ms" in plan.measured:
        rows = "\n".join(
            f"| {mode} | {ms:.2f} | {plan.measured['kernels_per_step'][mode] or '-'} |"
            for mode, ms in plan.measured["step_ms"].items()
        )
        metadata["measured"] = MetadataValue.md("| mode | median step ms | kernels per step |\n|---|---:|---:|\n" + rows)
    version = hashlib.sha256(json.dumps([graph.content_hash(), data["patterns"], data["regions"]]).encode()).hexdigest()[:16]
    return MaterializeResult(metadata=metadata, data_version=DataVersion(version))
