"""The gnn_checkpoint asset trains a checkpoint that deployment_plan then uses and records in its lineage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
from dagster import DagsterInstance, MultiPartitionKey, instance_for_test, materialize

from assets.capture import training_graph
from assets.cluster import cluster_topology
from assets.gnn import gnn_checkpoint
from assets.planning import deployment_plan, op_groups
from assets.profiling import op_profiles
from tag_core import artifacts, store
from tag_core.gnn.checkpoint import load_checkpoint
from tag_core.gnn.prior import CHECKPOINT_REF, trained_checkpoint
from tag_pipelines.partitions import model_partitions, topology_partitions
from tag_pipelines.resources import build_resources

pytestmark = pytest.mark.slow
MODEL = "mlp[features=16,hidden=8]"
TOPOLOGY = {"name": "small", "inter_gbps": 10, "machines": [
    {"name": "a", "gpu": "V100-16GB", "count": 2, "intra_gbps": 100},
    {"name": "b", "gpu": "T4", "count": 2, "intra_gbps": 50}]}
TRAIN = {"ops": {"gnn_checkpoint": {"config": {"models": [MODEL], "generations": 1, "episodes": 1,
                                               "iterations": 10, "topologies": 2}}}}


@pytest.fixture
def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DagsterInstance]:
    monkeypatch.setenv("TAG_HOME", str(tmp_path / "tag_home"))
    monkeypatch.setenv("TAG_GNN_CHECKPOINT", "")  # only the asset's checkpoint may guide plans here
    monkeypatch.setenv("TAG_ARTIFACTS", str(tmp_path / "artifacts"))  # its checkpoint ref is this test's alone
    (tmp_path / "topologies").mkdir()
    (tmp_path / "topologies" / "small.json").write_text(json.dumps(TOPOLOGY))
    monkeypatch.setenv("TAG_TOPOLOGY_DIR", str(tmp_path / "topologies"))
    with instance_for_test() as instance:
        yield instance


def _run(instance, assets, key=None, config=None, **kwargs):
    return materialize(assets, partition_key=key, instance=instance, resources=build_resources(),
                       run_config=config or {}, **kwargs)


def _lineage(instance, config: dict) -> dict:
    key = MultiPartitionKey({"model": MODEL, "topology": "small"})
    assert _run(instance, [deployment_plan], key, {"ops": {"deployment_plan": {"config": config}}}).success
    with store.connect(read_only=True) as conn:
        return store.latest_plan(conn, MODEL, "small")[1]["lineage"]


def test_checkpoint_asset_trains_and_plans_record_it(instance: DagsterInstance) -> None:
    failed = _run(instance, [gnn_checkpoint], config=TRAIN, raise_on_error=False)
    assert not failed.success  # nothing captured yet: a clean failure naming what to do
    assert "materialize training_graph" in str(failed.all_events)
    instance.add_dynamic_partitions(model_partitions.name, [MODEL])
    instance.add_dynamic_partitions(topology_partitions.name, ["small"])
    setup = {"resources": {"profiling": {"config": {"batch_sizes": [1, 2], "runs": 2, "warmup": 1}}},
             "ops": {"op_groups": {"config": {"groups": 6}}}}
    assert _run(instance, [training_graph, op_profiles, op_groups], MODEL, setup).success
    assert _run(instance, [cluster_topology], "small").success
    assert _lineage(instance, {"budget_iterations": 4})["prior"] == "uniform"  # no checkpoint anywhere yet

    result = _run(instance, [gnn_checkpoint], config=TRAIN)
    assert result.success
    meta = result.asset_materializations_for_node("gnn_checkpoint")[0].metadata
    path = trained_checkpoint()
    digest = load_checkpoint(path).short_hash
    assert meta["checkpoint_hash"].value == digest and meta["generations"].value == 1
    assert meta["training_curve"].value.startswith("![training curve](data:image/png;base64,")
    assert len(meta["curve"].value) == 1 and meta["fine_tuned_from"].value == "none"
    assert artifacts.get_ref(CHECKPOINT_REF) == meta["artifact"].value  # what any worker's plans read

    lineage = _lineage(instance, {"budget_iterations": 4})
    assert lineage["prior"] == "gnn" and lineage["checkpoint"] == digest
    with store.connect(read_only=True) as conn:
        assert store.plan_lineage(conn, MODEL, "small").checkpoint_hash.tolist()[-1] == digest
    assert _lineage(instance, {"budget_iterations": 4, "prior": "uniform"})["checkpoint"] is None

    # A second materialization fine-tunes the first checkpoint.
    more = {"ops": {"gnn_checkpoint": {"config": {**TRAIN["ops"]["gnn_checkpoint"]["config"], "generations": 2}}}}
    again = _run(instance, [gnn_checkpoint], config=more).asset_materializations_for_node("gnn_checkpoint")[0]
    assert again.metadata["fine_tuned_from"].value == digest and again.metadata["generations"].value == 2
