"""Stage 2: per-op compute times of each model's training step."""

# No `from __future__ import annotations`: Dagster checks the `context` annotation
# as a real type and rejects the string form.

from dagster import AssetExecutionContext, DataVersion, MaterializeResult, MetadataValue, asset
from dagster_duckdb import DuckDBResource

from tag_core import store
from tag_core.capture import resolve_model
from tag_core.profile import profile_model
from tag_pipelines.errors import input_errors_as_failures
from tag_pipelines.partitions import model_partitions
from tag_pipelines.resources import DUCKDB_POOL, ProfilingSettings, open_store

from ..capture import training_graph


@asset(
    partitions_def=model_partitions,
    deps=[training_graph],
    group_name="profile",
    pool=DUCKDB_POOL,
    kinds={"tensorflow", "duckdb"},
)
def op_profiles(
    context: AssetExecutionContext, duckdb: DuckDBResource, profiling: ProfilingSettings
) -> MaterializeResult:
    """`op_profiles` rows: each op's time per batch size and run on this machine's device type."""
    with input_errors_as_failures():
        spec = resolve_model(context.partition_key)
        with open_store(duckdb) as conn:
            rows = profile_model(
                conn, spec, list(profiling.batch_sizes), profiling.runs, profiling.warmup, show_progress=False
            )
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
