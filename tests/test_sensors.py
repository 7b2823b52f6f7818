"""Sensors, automation and the nightly schedule, evaluated against a real Dagster instance."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from dagster import (
    DagsterInstance,
    MultiPartitionKey,
    SensorResult,
    SkipReason,
    build_schedule_context,
    build_sensor_context,
    evaluate_automation_conditions,
    instance_for_test,
    materialize,
)

from assets.capture import training_graph
from sensors import model_sensor, nightly_replan, topology_snapshot_sensor
from tag_core.cluster import scan_snapshots
from tag_pipelines.definitions import defs
from tag_pipelines.partitions import model_partitions, topology_partitions
from tag_pipelines.resources import build_resources

ROOT = Path(__file__).resolve().parents[1]
TESTBED = ROOT / "examples" / "topologies" / "testbed.json"
TWO_RACKS = ROOT / "examples" / "topologies_hierarchical" / "two_racks.json"


@pytest.fixture
def instance():
    with instance_for_test() as instance:
        yield instance


@pytest.fixture
def snapshot_dir(tmp_path, monkeypatch):
    directory = tmp_path / "topologies"
    directory.mkdir()
    monkeypatch.setenv("TAG_TOPOLOGY_DIR", str(directory))
    monkeypatch.setenv("TAG_TOPOLOGY_SETTLE_S", "2")
    return directory


def settled(path: Path) -> Path:
    past = time.time() - 60
    os.utime(path, (past, past))
    return path


def tick(sensor, instance: DagsterInstance, cursor: str | None):
    context = build_sensor_context(instance=instance, cursor=cursor, definitions=defs)
    result = sensor(context)
    if isinstance(result, SensorResult):
        for request in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return result


def test_snapshot_scan_sorts_files_out(snapshot_dir, tmp_path):
    settled(Path(shutil.copy(TESTBED, snapshot_dir / "testbed.json")))
    (snapshot_dir / "fresh.json").write_text(TESTBED.read_text())  # just copied: still settling
    (snapshot_dir / "broken.json").write_text('{"name": "x", "machines": [')
    settled(snapshot_dir / "broken.json")
    outside = tmp_path / "outside.json"
    outside.write_text(TESTBED.read_text())
    (snapshot_dir / "link.json").symlink_to(outside)
    (snapshot_dir / ".partial.json").write_text("{")
    # Read exactly as `tag topology validate` reads a file: not UTF-8, NaN, or a repeated key are invalid.
    (snapshot_dir / "binary.json").write_bytes(b"\xff\xfe{}")
    (snapshot_dir / "nan.json").write_text(TESTBED.read_text().replace('"inter_gbps": 100', '"inter_gbps": NaN'))
    for name in ("binary.json", "nan.json"):
        settled(snapshot_dir / name)
    scans = {scan.name: scan for scan in scan_snapshots(snapshot_dir, settle_s=2)}
    status = {name: scan.status for name, scan in scans.items()}
    assert status == {"testbed": "ready", "fresh": "settling", "broken": "invalid", "link": "refused",
                      "binary": "invalid", "nan": "invalid"}
    assert "not UTF-8" in scans["binary"].reason and "NaN is not valid JSON" in scans["nan"].reason


def test_topology_sensor_new_changed_and_deleted(snapshot_dir, instance):
    settled(Path(shutil.copy(TESTBED, snapshot_dir / "testbed.json")))
    bad = snapshot_dir / "bad.json"
    bad.write_text(json.dumps({"name": "bad", "machines": [{"name": "m", "gpu": "V100-16GB", "count": 0,
                                                             "intra_gbps": 10}], "inter_gbps": 10}))
    settled(bad)

    first = tick(topology_snapshot_sensor, instance, None)
    assert [r.partition_key for r in first.run_requests] == ["testbed"]
    assert first.run_requests[0].run_key.startswith("topology:testbed:")
    assert instance.get_dynamic_partitions(topology_partitions.name) == ["testbed"]

    assert isinstance(tick(topology_snapshot_sensor, instance, first.cursor), SkipReason)

    data = json.loads(TESTBED.read_text())
    data["inter_gbps"] = 40
    (snapshot_dir / "testbed.json").write_text(json.dumps(data))
    settling = tick(topology_snapshot_sensor, instance, first.cursor)
    assert isinstance(settling, SkipReason), "a file changed a moment ago may be half-written"
    settled(snapshot_dir / "testbed.json")
    changed = tick(topology_snapshot_sensor, instance, first.cursor)
    assert len(changed.run_requests) == 1 and changed.run_requests[0].run_key != first.run_requests[0].run_key

    (snapshot_dir / "testbed.json").unlink()
    retired = tick(topology_snapshot_sensor, instance, changed.cursor)
    assert [r.run_key.split(":")[0] for r in retired.run_requests] == ["retire"]
    assert instance.get_dynamic_partitions(topology_partitions.name) == ["testbed"], "history stays"
    assert isinstance(tick(topology_snapshot_sensor, instance, retired.cursor), SkipReason)


def test_hierarchical_snapshot_is_scanned_requested_and_stored(snapshot_dir, instance, tag_home):
    """Racks, pods and uplinks pass the sensor's checks, and the stored snapshot keeps them."""
    from assets.cluster import cluster_topology
    from tag_core import store
    from tag_core.cluster import load_topology, recorded_topology

    settled(Path(shutil.copy(TWO_RACKS, snapshot_dir / "racks.json")))
    bad = json.loads(TWO_RACKS.read_text())
    bad["uplinks"]["rack"]["oversubscription"] = 0.5
    (snapshot_dir / "undersubscribed.json").write_text(json.dumps(bad))
    settled(snapshot_dir / "undersubscribed.json")
    scans = {scan.name: scan for scan in scan_snapshots(snapshot_dir, settle_s=2)}
    assert scans["racks"].status == "ready" and scans["racks"].topology.hierarchy.num_racks == 2
    assert scans["undersubscribed"].status == "invalid"
    assert scans["undersubscribed"].reason.startswith("uplinks.rack.oversubscription: must be between 1 and")

    first = tick(topology_snapshot_sensor, instance, None)
    assert [r.partition_key for r in first.run_requests] == ["racks"]
    assert first.run_requests[0].tags["tag/topology_hash"] == load_topology(TWO_RACKS).content_hash()
    assert materialize([cluster_topology], partition_key="racks", instance=instance,
                       resources=build_resources()).success
    with store.connect(tag_home / "tag.duckdb", read_only=True) as conn:
        stored = recorded_topology(conn, "racks")
    assert stored == load_topology(TWO_RACKS) and stored.rack_uplink.oversubscription == 4


def test_model_sensor_follows_the_registry_and_source_files(tmp_path, monkeypatch, instance, user_model_file):
    registry = tmp_path / "models.yaml"
    monkeypatch.setenv("TAG_MODELS_FILE", str(registry))
    assert isinstance(tick(model_sensor, instance, None), SkipReason)

    registry.write_text(f"models:\n  - mlp\n  - {user_model_file}:plain\n")
    first = tick(model_sensor, instance, None)
    assert sorted(r.partition_key for r in first.run_requests) == sorted(["mlp", f"{user_model_file}:plain"])
    assert set(instance.get_dynamic_partitions(model_partitions.name)) == {"mlp", f"{user_model_file}:plain"}
    assert isinstance(tick(model_sensor, instance, first.cursor), SkipReason)

    user_model_file.write_text(user_model_file.read_text() + "\n# a new layer, say\n")
    edited = tick(model_sensor, instance, first.cursor)
    assert [r.partition_key for r in edited.run_requests] == [f"{user_model_file}:plain"]

    registry.write_text("models: [mlp, mlp]\n")
    assert "listed twice" in tick(model_sensor, instance, edited.cursor).skip_message


@pytest.mark.slow
def test_eager_automation_requests_profiles_after_a_new_graph(tag_home, instance):
    model = "mlp[features=8,hidden=4]"
    instance.add_dynamic_partitions(model_partitions.name, [model])
    before = evaluate_automation_conditions(defs=defs, instance=instance)
    assert before.total_requested == 0, "nothing upstream yet"
    assert materialize([training_graph], partition_key=model, instance=instance, resources=build_resources()).success
    result = evaluate_automation_conditions(defs=defs, instance=instance, cursor=before.cursor)
    requested = {(key.to_user_string(), partition) for key, partitions in _requested(result) for partition in partitions}
    assert ("op_profiles", model) in requested
    assert not any(key == "deployment_plan" for key, _ in requested), "no topology yet"


def _requested(result):
    for key in ("op_profiles", "op_groups", "deployment_plan"):
        from dagster import AssetKey

        subset = result.get_requested_partitions(AssetKey(key))
        yield AssetKey(key), subset


def test_nightly_replan_covers_live_pairs(snapshot_dir, instance):
    settled(Path(shutil.copy(TESTBED, snapshot_dir / "testbed.json")))
    instance.add_dynamic_partitions(model_partitions.name, ["mlp", "small_cnn"])
    instance.add_dynamic_partitions(topology_partitions.name, ["testbed", "retired_one"])
    when = datetime.datetime(2026, 11, 30, 2, 0, tzinfo=datetime.timezone.utc)
    requests = nightly_replan(build_schedule_context(instance=instance, scheduled_execution_time=when))
    keys = {r.partition_key for r in requests}
    assert keys == {MultiPartitionKey({"model": m, "topology": "testbed"}) for m in ("mlp", "small_cnn")}
    assert all(r.run_config["ops"]["deployment_plan"]["config"]["warm_start"] for r in requests)
    assert len({r.run_key for r in requests}) == 2 and all("20261130T0200" in r.run_key for r in requests)


def test_a_probe_folder_is_a_snapshot_source(snapshot_dir, instance, tag_home):
    """`<name>.probes/` holds `tag topology probe` files: a GPU gone from one records a new snapshot."""
    from assets.cluster import cluster_topology
    from tag_core import store
    from tag_core.cluster import recorded_topology
    from tag_core.cluster.probe.machine import probe
    from tag_core.cluster.topology_diff import describe_changes

    recorded = snapshot_dir.parent / "dgx1"
    recorded.mkdir()
    for name in ("nvidia-smi-topo-m.txt", "nvidia-smi.txt", "ibstat.txt"):  # published outputs (SOURCE.md)
        shutil.copy(ROOT / "tests" / "data" / "probes" / "dgx1" / name, recorded / name)
    folder = snapshot_dir / "lab.probes"
    folder.mkdir()
    dgx = probe(recorded)
    (folder / "dgx1.json").write_text(json.dumps(dgx))
    (folder / "here.json").write_text(json.dumps(probe()))
    for path in (folder / "dgx1.json", folder / "here.json", folder):
        settled(path)

    first = tick(topology_snapshot_sensor, instance, None)
    assert [r.partition_key for r in first.run_requests] == ["lab"]
    assert materialize([cluster_topology], partition_key="lab", instance=instance, resources=build_resources()).success
    with store.connect(tag_home / "tag.duckdb", read_only=True) as conn:
        before = recorded_topology(conn, "lab")
    assert before.num_devices == 9

    dgx["gpus"] = dgx["gpus"][:-1]  # GPU 7 fell off the bus
    (folder / "dgx1.json").write_text(json.dumps(dgx))
    assert isinstance(tick(topology_snapshot_sensor, instance, first.cursor), SkipReason), "still settling"
    settled(folder / "dgx1.json")
    changed = tick(topology_snapshot_sensor, instance, first.cursor)
    assert [r.partition_key for r in changed.run_requests] == ["lab"]
    assert changed.run_requests[0].run_key != first.run_requests[0].run_key
    assert materialize([cluster_topology], partition_key="lab", instance=instance, resources=build_resources()).success
    with store.connect(tag_home / "tag.duckdb", read_only=True) as conn:
        after = recorded_topology(conn, "lab")
    # Without GPU 7 no ring of doubled NVLinks is left: the best ring drops to single links.
    assert describe_changes(before, after) == ["machine dgx1: 8 -> 7 GPUs (1 lost)",
                                               "machine dgx1: inside, 320 Gbit/s -> 160 Gbit/s"]
