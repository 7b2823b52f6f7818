"""Stage 2: per-op compute times of each model's training step."""

# No `from __future__ import annotations`: Dagster checks the `context` annotation
# as a real type and rejects the string form.

from dagster import AssetExecutionContext, DataVersion, MaterializeResult, MetadataValue, asset
from dagster_duckdb import DuckDBResource

from tag_core import store
from tag_core.capture import load_op_graph, resolve_model, save_op_graph
from tag_core.profile import profile_model
from tag_core.store.profiles import load_profile_steps
from tag_pipelines.errors import input_errors_as_failures
from tag_pipelines.partitions import model_partitions
from tag_pipelines.resources import ProfilingSettings, open_store, scratch_store

from ..capture import training_graph

_CAPTURE_FIELDS = ("batch_size", "source_hash", "graph_hash", "graph_file", "step_file")


@asset(
    partitions_def=model_partitions,
    deps=[training_graph],
    group_name="profile",
    kinds={"tensorflow", "duckdb"},
)
def op_profiles(
    context: AssetExecutionContext, duckdb: DuckDBResource, profiling: ProfilingSettings
) -> MaterializeResult:
    """`op_profiles` rows: each op's time per batch size and run on this machine's device type."""
    with input_errors_as_failures():
        spec = resolve_model(context.partition_key)
        with open_store(duckdb) as conn:  # a short read: the captured graph, if any
            record = store.captured_model(conn, spec.name)
            graph = load_op_graph(conn, spec.name) if record is not None else None
        with scratch_store() as scratch:  # profile (minutes) against a private copy, not the shared store
            if graph is not None:
                save_op_graph(scratch, graph, record["source_hash"], record["graph_file"], record["step_file"])
            rows = profile_model(
                scratch, spec, list(profiling.batch_sizes), profiling.runs, profiling.warmup, show_progress=False
            )
            steps = load_profile_steps(scratch, spec.name)
            # profile_model captures again when the stored graph is missing or stale: that graph is copied back too.
            now = store.captured_model(scratch, spec.name)
            same = record is not None and all(now[k] == record[k] for k in _CAPTURE_FIELDS)
            recaptured = None if same else (now, load_op_graph(scratch, spec.name))
        with open_store(duckdb) as conn:  # then write in one short session
            if recaptured is not None:
                now, fresh = recaptured
                save_op_graph(conn, fresh, now["source_hash"], now["graph_file"], now["step_file"])
            store.replace_profiles(conn, rows, steps)
            summary = store.profile_summary(conn, spec.name)
            profile_hash = store.profile_set_hash(conn, spec.name)
    return MaterializeResult(
        metadata={
            "rows": len(rows),
            "ops": int(rows["op"].nunique()),
            "batch_sizes": sorted(int(b) for b in rows["batch_size"].unique()),
            "runs": profiling.runs,
            "device_type": ", ".join(sorted(rows["device_type"].unique())),
            "profile_set_hash": profile_hash,
            "summary": MetadataValue.md(summary.to_markdown(index=False)),
        },
        # The hash covers every stored profile of this model, all device types.
        data_version=DataVersion(profile_hash),
    )
