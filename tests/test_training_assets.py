"""The `training_run` asset: a plan trained on real data through Dagster into DuckDB, and trained on from its
checkpoint under the plan that a changed topology snapshot brings (a machine lost)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from dagster import AssetKey, MultiPartitionKey, instance_for_test, materialize

from assets.capture import training_graph
from assets.cluster import calibration, cluster_topology
from assets.planning import deployment_plan, op_groups
from assets.profiling import op_profiles
from assets.training import training_folder, training_run
from tag_core import artifacts, store
from tag_pipelines.definitions import defs
from tag_pipelines.partitions import model_partitions, topology_partitions
from tag_pipelines.resources import build_resources

MODEL = "mlp[features=64,hidden=16]"
MACHINE = {"gpu": "V100-32GB", "count": 1, "intra_gbps": 100}
TWO = {"name": "local", "inter_gbps": 7.8, "machines": [{"name": "task0", **MACHINE}, {"name": "task1", **MACHINE}]}
ONE = {**TWO, "machines": TWO["machines"][:1]}


def test_training_run_is_wired_and_left_out_of_the_automation() -> None:
    graph = defs.resolve_asset_graph()
    node = graph.get(AssetKey("training_run"))
    assert node.parent_keys == {deployment_plan.key}
    assert node.group_name == "train" and node.automation_condition is None
    assert graph.get(deployment_plan.key).automation_condition is not None


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_training_run_trains_then_goes_on_under_a_replan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAG_HOME", str(tmp_path / "tag_home"))
    monkeypatch.setenv("TAG_ARTIFACTS", str(tmp_path / "artifacts"))  # its run folder's ref is this test's alone
    topologies = tmp_path / "topologies"
    topologies.mkdir()
    (topologies / "local.json").write_text(json.dumps(TWO))
    monkeypatch.setenv("TAG_TOPOLOGY_DIR", str(topologies))
    rng = np.random.default_rng(0)
    data = tmp_path / "data.npz"
    x = rng.random((320, 64), dtype=np.float32)
    np.savez(data, features=x, labels=(x[:, :10].argmax(axis=1)).astype(np.int32))
    key = MultiPartitionKey({"model": MODEL, "topology": "local"})
    plan_config = {"ops": {"deployment_plan": {"config": {"budget_iterations": 5, "seed": 1}}}}
    train_config = {"ops": {"training_run": {"config": {"data": str(data), "validation_data": str(data),
                                                         "epochs": 2, "checkpoint_every": 5}}}}

    def run(selection, partition, config=None):
        result = materialize(selection, partition_key=partition, instance=instance, resources=build_resources(),
                             run_config=config or {})
        assert result.success
        return result

    with instance_for_test() as instance:
        instance.add_dynamic_partitions(model_partitions.name, [MODEL])
        instance.add_dynamic_partitions(topology_partitions.name, ["local"])
        profiling = {"resources": {"profiling": {"config": {"batch_sizes": [16, 32], "runs": 2, "warmup": 1}}}}
        run([training_graph, op_profiles, op_groups], MODEL, profiling)
        run([cluster_topology, calibration], "local")
        run([deployment_plan], key, plan_config)
        first = run([training_run], key, train_config).asset_materializations_for_node("training_run")[0].metadata
        assert first["first_step"].value == 0 and first["steps"].value == 20  # 2 epochs of 10 batches of 32
        assert "data:image/png;base64," in first["loss_curve"].value
        assert 0 <= first["validation_accuracy"].value <= 1
        # A machine is lost: the snapshot changes, the planner re-plans, and training goes on from the checkpoint.
        (topologies / "local.json").write_text(json.dumps(ONE))
        run([cluster_topology, calibration], "local")
        run([deployment_plan], key, plan_config)
        shutil.rmtree(training_folder(MODEL, "local"))  # the next run's worker has none of this one's disk
        more = {"ops": {"training_run": {"config": {**train_config["ops"]["training_run"]["config"], "epochs": 3}}}}
        second = run([training_run], key, more).asset_materializations_for_node("training_run")[0].metadata
    assert second["first_step"].value == 20 and second["steps"].value == 30  # from the published checkpoint
    assert second["artifact"].value != first["artifact"].value
    assert second["plan_id"].value != first["plan_id"].value
    folder = training_folder(MODEL, "local")
    assert (folder / "model.keras").is_file()
    with store.connect(tmp_path / "tag_home" / "tag.duckdb", read_only=True) as conn:
        runs = store.load_training_runs(conn, MODEL)
        snapshots = {row["topology_hash"] for row in runs.to_dict("records")}
    assert len(runs) == 2 and set(runs.status) == {"done"} and len(snapshots) == 2
    assert list(runs.first_step) == [20, 0]  # newest first
    assert all(artifacts.fetch(address).is_file() for address in runs.model_file)
