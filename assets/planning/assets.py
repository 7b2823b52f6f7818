"""Stage 3: op groups per model and the deployment plan per model × topology."""

# No `from __future__ import annotations`: Dagster checks the `context` annotation
# as a real type and rejects the string form.

import hashlib
import json
from typing import Optional

from dagster import (
    AssetExecutionContext,
    Config,
    DataVersion,
    MaterializeResult,
    MetadataValue,
    asset,
)
from dagster_duckdb import DuckDBResource
from pydantic import Field

from tag_core import store
from tag_core.capture import load_op_graph, resolve_model
from tag_core.cluster import recorded_topology
from tag_core.fusion import FusionPlan
from tag_core.gnn.prior import pipeline_prior, sized_prior
from tag_core.plan import DEFAULT_ITERATIONS, make_groups, markdown_table, plan
from tag_core.plan.measured_error import measured_error
from tag_core.report import markdown_image, plan_pictures
from tag_core.search import DEFAULT_GROUPS, Budget, OpGroups
from tag_core.simulate.comm import comm_for
from tag_pipelines.errors import input_errors_as_failures
from tag_pipelines.partitions import model_partitions, model_topology_partitions
from tag_pipelines.resources import open_store

from ..capture import training_graph
from ..cluster import calibration, cluster_topology
from ..profiling import op_profiles
from .checks import PLAN_CHECKS, plan_check_results


class GroupsConfig(Config):
    groups: int = Field(default=DEFAULT_GROUPS, description="Number of METIS op groups.")
    seed: int = Field(default=0, description="METIS seed.")


class PlanConfig(Config):
    budget_iterations: int = Field(default=DEFAULT_ITERATIONS, description="MCTS iterations.")
    budget_seconds: Optional[float] = Field(default=None, description="MCTS seconds (instead of iterations).")
    seed: int = Field(default=0, description="Search seed.")
    batch_size: Optional[int] = Field(default=None, description="Global batch (default: the model's).")
    warm_start: bool = Field(default=True, description="Start from this model × topology's previous plan.")
    prior: str = Field(default="auto", description="MCTS priors: gnn, uniform, or auto (the GNN when a checkpoint "
                                                   "exists: gnn_checkpoint's, else the shipped one).")


@asset(
    partitions_def=model_partitions,
    deps=[training_graph, op_profiles],
    group_name="plan",
    kinds={"duckdb"},
)
def op_groups(context: AssetExecutionContext, duckdb: DuckDBResource, config: GroupsConfig) -> MaterializeResult:
    """METIS groups of each model's ops (compute-weighted, cut on thin tensors), largest compute first."""
    with input_errors_as_failures():
        spec = resolve_model(context.partition_key)
        with open_store(duckdb) as conn:
            graph = load_op_graph(conn, spec.name)
            profiles = store.load_profiles(conn, spec.name)
        groups = make_groups(graph, profiles, config.groups, config.seed)
        with open_store(duckdb) as conn:
            store.save_op_groups(conn, spec.name, graph.content_hash(), groups.to_json(), groups.content_hash())
    top = "\n".join(f"| {g} | {len(groups.members(g))} | {groups.group_time_us[g]:.0f} |"
                    for g in range(min(10, groups.num_groups)))
    return MaterializeResult(
        metadata={
            "groups": groups.num_groups,
            "groups_hash": groups.content_hash(),
            "graph_hash": graph.content_hash(),
            "largest_groups": MetadataValue.md("| group | ops | compute µs |\n|---|---:|---:|\n" + top),
        },
        data_version=DataVersion(groups.content_hash()),
    )


@asset(
    partitions_def=model_topology_partitions,
    deps=[op_groups, cluster_topology, calibration, op_profiles],
    check_specs=PLAN_CHECKS,
    group_name="plan",
    kinds={"duckdb"},
)
def deployment_plan(context: AssetExecutionContext, duckdb: DuckDBResource, config: PlanConfig) -> MaterializeResult:
    """MCTS plan of each model on each topology, with the baselines it beats and its lineage (`plans` table)."""
    keys = context.partition_key.keys_by_dimension
    model_key, topology_key = keys["model"], keys["topology"]
    with input_errors_as_failures():
        spec = resolve_model(model_key)
        with open_store(duckdb) as conn:  # read everything, then let go of the store during the search
            graph = load_op_graph(conn, spec.name)
            profiles = store.load_profiles(conn, spec.name)
            profile_hash = store.profile_set_hash(conn, spec.name)
            stored_groups = store.load_op_groups(conn, spec.name)
            topology = recorded_topology(conn, topology_key)
            previous = store.latest_plan(conn, spec.name, topology_key) if config.warm_start else None
            fusion = store.load_fusion_plan(conn, spec.name, graph.content_hash())
            comm, uncalibrated = comm_for(conn, topology)
            error = measured_error(conn, topology, comm.calibration_hash)
        groups = None
        if stored_groups is not None and stored_groups["graph_hash"] == graph.content_hash():
            groups = OpGroups.from_json(stored_groups["groups"])
        budget = (Budget(seconds=config.budget_seconds) if config.budget_seconds
                  else Budget(iterations=config.budget_iterations))
        num_groups = groups.num_groups if groups is not None else DEFAULT_GROUPS
        prior = sized_prior(lambda: pipeline_prior(config.prior), config.prior, topology.num_machines, num_groups)
        if prior.warning:
            context.log.warning(prior.warning)
        result = plan(graph, topology, profiles, batch_size=config.batch_size, groups=groups, budget=budget,
                      seed=config.seed, warm_start=previous[1] if previous else None, profile_hash=profile_hash,
                      fusion=FusionPlan.from_json(fusion) if fusion else None,
                      prior=prior.prior, lineage={"warm_start_from": previous[0] if previous else None,
                                                  **prior.lineage()},
                      comm=comm, uncalibrated_because=uncalibrated, measured_error=error)
        data = result.to_dict()
        # One id per run and partition: a step retried after its worker died saves the same plan, which lands once.
        plan_id = hashlib.sha256(f"{context.run.run_id}/{context.partition_key}".encode()).hexdigest()[:16]
        with open_store(duckdb) as conn:
            store.save_plan(conn, plan_id, data, source="dagster", topology_key=topology_key)
    speedup = data["speedup_vs_dp_nccl"]
    pictures = plan_pictures(graph, profiles, topology, data)
    return MaterializeResult(
        check_results=plan_check_results(data),
        metadata={
            "placement": MetadataValue.md(markdown_image(pictures.heatmap, "placement heatmap")),
            "timeline": MetadataValue.md(markdown_image(pictures.gantt, "simulated iteration")),
            "vs_baselines_chart": MetadataValue.md(markdown_image(pictures.speedup, "TAG against every baseline")),
            "memory": MetadataValue.md(markdown_image(pictures.memory, "peak memory per device")),
            "plan_id": plan_id,
            "tag_iteration_ms": data["tag"]["iteration_time_s"] * 1e3,
            "speedup_vs_dp_nccl": speedup if speedup is not None else MetadataValue.text("DP-NCCL out of memory"),
            "tag_over_ideal": data["tag"]["iteration_time_s"] / data["ideal_time_s"],
            "oom": data["oom"],
            "vs_baselines": MetadataValue.md(markdown_table(data)),
            "search": MetadataValue.json(data["search"]),
            "lineage": MetadataValue.json(data["lineage"]),
        },
        data_version=DataVersion(_plan_version(data)),
    )


def _plan_version(data: dict) -> str:
    """Content version of a plan: its strategy and the lineage it came from (not timings)."""
    text = json.dumps({"strategy": data["strategy"], "lineage": data["lineage"]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
