"""Stage 1: the training graph of each model, captured into the store."""

# No `from __future__ import annotations`: Dagster checks the `context` annotation
# as a real type and rejects the string form.

from dagster import AssetExecutionContext, DataVersion, MaterializeResult, MetadataValue, asset
from dagster_duckdb import DuckDBResource

from tag_core import artifacts, store
from tag_core.capture import capture_model, resolve_model, save_op_graph
from tag_pipelines.errors import input_errors_as_failures
from tag_pipelines.partitions import model_partitions
from tag_pipelines.resources import open_store, scratch_store


@asset(
    partitions_def=model_partitions,
    group_name="capture",
    kinds={"tensorflow", "duckdb"},
)
def training_graph(context: AssetExecutionContext, duckdb: DuckDBResource) -> MaterializeResult:
    """One training step (forward, loss, gradients, Adam update) as an OpGraph in the
    `ops`/`edges` tables, plus its GraphDef and step files under TAG_ARTIFACTS (the store keeps their
    addresses: any worker reads them)."""
    with input_errors_as_failures():
        spec = resolve_model(context.partition_key)
        with scratch_store() as scratch:  # trace without the shared store: minutes for a large model
            graph = capture_model(scratch, spec)
            record = store.captured_model(scratch, spec.name)
        with open_store(duckdb) as conn:  # then one short transaction
            save_op_graph(conn, graph, record["source_hash"], record["graph_file"], record["step_file"])
    summary = graph.summary()
    return MaterializeResult(
        metadata={
            "ops": summary["ops"],
            "edges": summary["edges"],
            "parameters": summary["parameters"],
            "parameter_bytes": summary["parameter_bytes"],
            "gradient_ops": summary["gradient_ops"],
            "apply_ops": summary["apply_ops"],
            "flops_per_step": summary["flops_per_step"],
            "batch_size": summary["batch_size"],
            "graph_hash": summary["hash"],
            "graph_file": MetadataValue.path(artifacts.url(record["graph_file"])),
            "step_file": MetadataValue.text(record["step_file"]),  # the address, as the store holds it
        },
        # Downstream assets are stale only when the graph itself changed.
        data_version=DataVersion(summary["hash"]),
    )
