"""Stage 5: the distributed TF graph of each model × topology's latest plan, written to disk."""

# No `from __future__ import annotations`: Dagster checks the `context` annotation
# as a real type and rejects the string form.

import hashlib

from dagster import (
    AssetExecutionContext,
    DataVersion,
    MaterializeResult,
    MetadataValue,
    asset,
)
from dagster_duckdb import DuckDBResource

from tag_core import artifacts, store
from tag_core.capture import resolve_model
from tag_core.capture.steps import model_slug
from tag_core.cluster import recorded_topology
from tag_core.emit import emit_folder
from tag_core.errors import TagInputError
from tag_pipelines.errors import input_errors_as_failures
from tag_pipelines.partitions import model_topology_partitions
from tag_pipelines.resources import open_store

from ..planning import deployment_plan
from .checks import GRAPH_CHECK, graph_check
from .config import EmitConfig


def graph_folder(model: str, topology: str):
    """$TAG_HOME/graphs/<model>/<topology>/ (the model as a file-system-safe name)."""
    return (store.tag_home() / "graphs" / model_slug(model) / topology).resolve()


@asset(
    partitions_def=model_topology_partitions,
    deps=[deployment_plan],
    check_specs=[GRAPH_CHECK],
    group_name="emit",
    kinds={"tensorflow"},
)
def distributed_graph(context: AssetExecutionContext, duckdb: DuckDBResource, config: EmitConfig) -> MaterializeResult:
    """The latest plan emitted as a TF GraphDef with its cluster spec, under $TAG_HOME/graphs/<model>/<topology>/."""
    keys = context.partition_key.keys_by_dimension
    model_key, topology_key = keys["model"], keys["topology"]
    with input_errors_as_failures():
        spec = resolve_model(model_key)
        with open_store(duckdb) as conn:
            latest = store.latest_plan(conn, spec.name, topology_key)
            topology = recorded_topology(conn, topology_key)
            profiles = store.load_profiles(conn, spec.name)
        if latest is None:
            raise TagInputError("plan", f"no plan for {spec.name} on {topology_key}; materialize deployment_plan")
        plan_id, plan = latest
        out = graph_folder(spec.name, topology_key)
        emission = emit_folder(spec, out, topology, plan=plan, device_kind=config.device_kind, force=True,
                               profiles=None if profiles.empty else profiles)
    summary = emission.summary()
    check = graph_check(emission, out, config, context)
    address = artifacts.publish_folder(out, f"graphs/{model_slug(spec.name)}/{topology_key}")  # for any worker
    return MaterializeResult(
        check_results=[check],
        metadata={
            "folder": MetadataValue.path(str(out)),
            "artifact": MetadataValue.text(address),
            "plan_id": plan_id,
            "emitted_ops": summary["emitted_ops"],
            "single_device_ops": summary["single_device_ops"],
            "collectives": summary["collectives"],
            "device_kind": summary["device_kind"],
            "emit_seconds": summary["emit_seconds"],
            "placements": MetadataValue.json(summary["placements"]),
            "notes": MetadataValue.json(emission.notes),
            "lineage": MetadataValue.json({"plan_id": plan_id, **emission.lineage}),
        },
        data_version=DataVersion(_graph_version(out)),
    )


def _graph_version(out) -> str:
    return hashlib.sha256((out / "graph.pb").read_bytes()).hexdigest()[:16]
