"""Planning assets end to end: a tiny model on a small topology, through Dagster into DuckDB."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
from dagster import DagsterInstance, MultiPartitionKey, instance_for_test, materialize

from assets.capture import training_graph
from assets.cluster import calibration, cluster_topology
from assets.planning import deployment_plan, op_groups
from assets.profiling import op_profiles
from assets.sfb import sfb_decisions
from tag_core import artifacts, store
from tag_core.capture.steps import load_op_graph
from tag_core.gnn.prior import CHECKPOINT_REF
from tag_core.cluster.topology_json import parse_topology
from tag_core.sfb.milp import find_subgraphs
from tag_core.simulate.simulator import Simulator
from tag_core.simulate.strategy import Strategy
from tag_pipelines.definitions import defs
from tag_pipelines.partitions import model_partitions, model_topology_partitions, topology_partitions
from tag_pipelines.resources import build_resources

MODEL = "mlp[features=16,hidden=8]"
TOPOLOGY = {"name": "small", "inter_gbps": 10, "machines": [
    {"name": "a", "gpu": "V100-16GB", "count": 2, "intra_gbps": 100},
    {"name": "b", "gpu": "T4", "count": 2, "intra_gbps": 50}]}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TAG_HOME", str(tmp_path / "tag_home"))
    topologies = tmp_path / "topologies"
    topologies.mkdir()
    (topologies / "small.json").write_text(json.dumps(TOPOLOGY))
    (topologies / "broken.json").write_text(json.dumps({**TOPOLOGY, "inter_gbps": -1}))
    monkeypatch.setenv("TAG_TOPOLOGY_DIR", str(topologies))
    return tmp_path


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


def _materialize(instance, selection, key, run_config=None, **kwargs):
    return materialize(selection, partition_key=key, instance=instance, resources=build_resources(),
                       run_config=run_config or {}, **kwargs)


PLAN_KEY = MultiPartitionKey({"model": MODEL, "topology": "small"})
PLAN_CONFIG = {"ops": {"deployment_plan": {"config": {"budget_iterations": 15, "seed": 2}}}}


@pytest.mark.slow
def test_plan_assets_materialize_end_to_end(env: Path, instance: DagsterInstance,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    instance.add_dynamic_partitions(model_partitions.name, [MODEL])
    instance.add_dynamic_partitions(topology_partitions.name, ["small"])
    profiling = {"resources": {"profiling": {"config": {"batch_sizes": [1, 2], "runs": 2, "warmup": 1}}},
                 "ops": {"op_groups": {"config": {"groups": 6}}}}
    assert _materialize(instance, [training_graph, op_profiles, op_groups], MODEL, profiling).success
    assert _materialize(instance, [cluster_topology], "small").success
    first = _materialize(instance, [deployment_plan], PLAN_KEY, PLAN_CONFIG)
    assert first.success
    second = _materialize(instance, [deployment_plan], PLAN_KEY, PLAN_CONFIG)
    assert second.success

    with store.connect(env / "tag_home" / "tag.duckdb", read_only=True) as conn:
        graph_hash = store.captured_model(conn, MODEL)["graph_hash"]
        profile_hash = store.profile_set_hash(conn, MODEL)
        groups = store.load_op_groups(conn, MODEL)
        snapshot = store.latest_topology_snapshot(conn, "small")
        plans = store.load_plans(conn, MODEL, "small")
    assert groups["graph_hash"] == graph_hash and len(groups["groups"]["group_time_us"]) <= 6
    assert snapshot["snapshot"]["machines"][1]["gpu"] == "T4"
    assert len(plans) == 2 and set(plans.source) == {"dagster"}

    meta = first.asset_materializations_for_node("deployment_plan")[0].metadata
    row = plans[plans.plan_id == meta["plan_id"].value].iloc[0]
    data = json.loads(row.plan)
    # Lineage: the plan row names exactly the graph, profiles, groups and snapshot that made it.
    assert (row.graph_hash, row.profile_hash, row.groups_hash, row.topology_hash) == (
        graph_hash, profile_hash, groups["groups_hash"], snapshot["content_hash"])
    assert row.seed == 2 and json.loads(row.budget) == {"iterations": 15}
    assert row.code_version == data["lineage"]["code_version"]
    assert data["groups"] == len(groups["groups"]["group_time_us"]) and data["search"]["iterations"] == 15
    assert row.tag_time_s == data["tag"]["iteration_time_s"] <= data["baselines"]["dp_nccl"]["iteration_time_s"]
    assert row.warm_start_from is None
    # The second plan started from the first.
    second_id = second.asset_materializations_for_node("deployment_plan")[0].metadata["plan_id"].value
    assert plans[plans.plan_id == second_id].iloc[0].warm_start_from == meta["plan_id"].value
    assert plans[plans.plan_id == second_id].iloc[0].tag_time_s <= row.tag_time_s
    # What a person sees: TAG against every baseline, and the lineage.
    table = meta["vs_baselines"].value
    for label in ("TAG", "DP-NCCL", "DP-NCCL-P", "Horovod", "MCMC", "ideal"):
        assert f"| {label}" in table
    assert meta["lineage"].value["graph_hash"] == graph_hash
    assert meta["tag_iteration_ms"].value == pytest.approx(data["tag"]["iteration_time_s"] * 1e3)
    for picture in ("placement", "timeline", "vs_baselines_chart", "memory"):
        assert meta[picture].value.startswith("![") and "data:image/png;base64," in meta[picture].value
    checks = {c.check_name: c.passed for c in first.get_asset_check_evaluations()}
    assert checks == {"plan_fits_memory": True, "plan_beats_baselines": True}

    # SFB: the table holds exactly the latest plan's rebuilt gradients.
    sfb_run = _materialize(instance, [sfb_decisions], PLAN_KEY)
    assert sfb_run.success
    with store.connect(env / "tag_home" / "tag.duckdb", read_only=True) as conn:
        table = store.load_sfb_decisions(conn, MODEL, "small")
        graph = load_op_graph(conn, MODEL)
    latest = json.loads(plans[plans.plan_id == second_id].iloc[0].plan)
    assert sorted(table.variable) == sorted(g["variable"] for g in latest["sfb"]["gradients"])
    assert set(table.plan_id) <= {second_id}
    sfb_meta = sfb_run.asset_materializations_for_node("sfb_decisions")[0].metadata
    # Every gradient the plan synchronises was considered (none when the search chose a plan without
    # replicated variables, which the profiles of a slower machine may make the fastest).
    sim = Simulator(graph, parse_topology(snapshot["snapshot"]), batch_size=latest["batch_size"])
    synchronised = len(find_subgraphs(sim, Strategy.from_dict(latest)))
    assert sfb_meta["considered"].value == latest["sfb"]["considered"] == synchronised
    assert sum(latest["sfb"]["by_status"].values()) == synchronised
    assert sfb_meta["iteration_ms"].value <= sfb_meta["iteration_ms_without_sfb"].value

    # A checkpoint ref naming an artifact its root does not hold (a wrong TAG_ARTIFACTS, a pruned bucket): one line.
    monkeypatch.setenv("TAG_ARTIFACTS", str(env / "other_root"))  # the session's root stays clean
    missing = f"sha256/ab/{'ab' * 32}/checkpoint.pt"
    artifacts.set_ref(CHECKPOINT_REF, missing)
    failed = _materialize(instance, [deployment_plan], PLAN_KEY, PLAN_CONFIG, raise_on_error=False)
    (failure,) = [event for event in failed.all_events if event.is_step_failure]
    assert failure.step_failure_data.user_failure_data.description == (
        f"artifact: {missing} is missing under TAG_ARTIFACTS={env / 'other_root'}")

    # A deleted snapshot is retired, and its plans stay.
    (env / "topologies" / "small.json").unlink()
    assert _materialize(instance, [cluster_topology], "small").success
    with store.connect(read_only=True) as conn:
        assert store.retired_topologies(conn) == {"small"}
        assert len(store.load_plans(conn, topology="small")) == 2


@pytest.mark.parametrize("key,expected", [
    ("broken", "inter_gbps"),
    ("absent", "no snapshot"),
    ("..", "not a snapshot name"),
])
def test_cluster_topology_refuses_bad_snapshots(env: Path, instance: DagsterInstance, key: str, expected: str) -> None:
    instance.add_dynamic_partitions(topology_partitions.name, [key])
    result = _materialize(instance, [cluster_topology], key, raise_on_error=False)
    assert not result.success
    (failure,) = result.get_step_failure_events()
    description = failure.step_failure_data.user_failure_data.description
    assert expected in description and "\n" not in description


def test_cluster_topology_refuses_a_symlink_out_of_the_directory(env: Path, instance: DagsterInstance) -> None:
    outside = env / "outside.json"
    outside.write_text(json.dumps(TOPOLOGY))
    (env / "topologies" / "escape.json").symlink_to(outside)
    instance.add_dynamic_partitions(topology_partitions.name, ["escape"])
    result = _materialize(instance, [cluster_topology], "escape", raise_on_error=False)
    assert not result.success
    assert "leaves" in result.get_step_failure_events()[0].step_failure_data.user_failure_data.description


@pytest.mark.slow
def test_deployment_plan_without_a_snapshot_fails_cleanly(env: Path, instance: DagsterInstance) -> None:
    instance.add_dynamic_partitions(model_partitions.name, [MODEL])
    instance.add_dynamic_partitions(topology_partitions.name, ["small"])
    assert _materialize(instance, [training_graph], MODEL).success
    result = _materialize(instance, [deployment_plan], PLAN_KEY, PLAN_CONFIG, raise_on_error=False)
    assert not result.success
    description = result.get_step_failure_events()[0].step_failure_data.user_failure_data.description
    assert "materialize cluster_topology" in description


def test_planning_assets_are_wired() -> None:
    graph = defs.resolve_asset_graph()
    for key, partitions in (("op_groups", model_partitions), ("cluster_topology", topology_partitions),
                            ("deployment_plan", model_topology_partitions)):
        assets_def = defs.resolve_assets_def(key)
        assert assets_def.partitions_def == partitions
        assert assets_def.op.pool is None  # partitions run in parallel; writes take turns on the file
        assert assets_def.group_names_by_key[assets_def.key] == "plan"
    assert graph.get(op_groups.key).parent_keys == {training_graph.key, op_profiles.key}
    assert graph.get(deployment_plan.key).parent_keys == {op_groups.key, cluster_topology.key, calibration.key,
                                                          op_profiles.key}


def test_sfb_decisions_need_a_plan(env: Path, instance: DagsterInstance) -> None:
    instance.add_dynamic_partitions(model_partitions.name, [MODEL])
    instance.add_dynamic_partitions(topology_partitions.name, ["small"])
    result = _materialize(instance, [sfb_decisions], PLAN_KEY, raise_on_error=False)
    assert not result.success
    description = result.get_step_failure_events()[0].step_failure_data.user_failure_data.description
    assert "deployment_plan" in description and "materialize it first" in description and "\n" not in description
