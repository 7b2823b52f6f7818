"""Sufficient Factor Broadcasting decisions per model × topology: the gradients the plan rebuilds
from gathered factors instead of synchronising them (the planner decides them; see tag_core.sfb)."""

# No `from __future__ import annotations`: Dagster checks the `context` annotation
# as a real type and rejects the string form.

from collections import Counter

from dagster import AssetExecutionContext, DataVersion, MaterializeResult, MetadataValue, asset
from dagster_duckdb import DuckDBResource

from tag_core import store
from tag_core.capture import resolve_model
from tag_core.errors import TagInputError
from tag_pipelines.errors import input_errors_as_failures
from tag_pipelines.partitions import model_topology_partitions
from tag_pipelines.resources import open_store

from ..planning import deployment_plan


@asset(partitions_def=model_topology_partitions, deps=[deployment_plan], group_name="plan", kinds={"duckdb"})
def sfb_decisions(context: AssetExecutionContext, duckdb: DuckDBResource) -> MaterializeResult:
    """The latest plan's SFB gradients, the op types they duplicate and the saving each brings (`sfb_decisions`)."""
    keys = context.partition_key.keys_by_dimension
    topology = keys["topology"]
    with input_errors_as_failures():
        model = resolve_model(keys["model"]).name
        with open_store(duckdb) as conn:
            latest = store.latest_plan(conn, model, topology)
            if latest is None:
                raise TagInputError("deployment_plan", f"no plan for {model} on {topology}; materialize it first")
            plan_id, data = latest
            sfb = data.get("sfb") or {}
            gradients = sfb.get("gradients", [])
            store.save_sfb_decisions(conn, model, topology, plan_id, gradients)
    rows = "\n".join(f"| {g['variable']} | {', '.join(g['op_types'])} | {g['estimated_saving_s'] * 1e3:.3f} |"
                     for g in gradients)
    types = Counter(t for g in gradients for t in g["op_types"])
    metadata = {
        "plan_id": plan_id,
        "sfb_gradients": len(gradients),
        "considered": sfb.get("considered", 0),
        "by_status": MetadataValue.json(sfb.get("by_status", {})),
        "duplicated_op_types": MetadataValue.json(dict(types.most_common())),
        "iteration_ms": data["tag"]["iteration_time_s"] * 1e3,
        "iteration_ms_without_sfb": data["tag"].get("iteration_time_s_without_sfb", data["tag"]["iteration_time_s"]) * 1e3,
        "solve_ms_median": sfb.get("solve_s_median", 0.0) * 1e3,
        "solve_ms_max": sfb.get("solve_s_max", 0.0) * 1e3,
        "gradients": MetadataValue.md("| variable | duplicated op types | estimated saving ms |\n|---|---|---:|\n" + rows
                                      if rows else "no gradient rebuilt from factors"
                                      + ("" if sfb else " (the plan was made without SFB)")),
    }
    return MaterializeResult(metadata=metadata, data_version=DataVersion(plan_id))
