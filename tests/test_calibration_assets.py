"""The `calibration` asset and `calibration_sensor`: a calibration dropped beside the snapshots is applied to
plans on that snapshot only, and a new one re-plans it. Real Dagster and DuckDB."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from dagster import SensorResult, SkipReason, build_sensor_context, instance_for_test, materialize

from assets.cluster import calibration, cluster_topology
from sensors import calibration_sensor
from tag_core import store
from tag_core.cluster import parse_topology
from tag_core.cluster.calibration import Calibration, Fit, Overheads
from tag_core.cluster.calibration_json import write_calibration_file
from tag_pipelines.definitions import defs
from tag_pipelines.partitions import topology_partitions
from tag_pipelines.resources import build_resources

SNAPSHOT = {"name": "pair", "inter_gbps": 10, "machines": [
    {"name": "a", "gpu": "V100-16GB", "count": 1, "intra_gbps": 100},
    {"name": "b", "gpu": "T4", "count": 1, "intra_gbps": 50}]}


def _calibration(snapshot: dict, latency_s: float = 4e-4) -> Calibration:
    topology = parse_topology(snapshot)
    fit = Fit(latency_s=latency_s, gbps=7.8, residual_rms_s=1e-5, residual_max_rel=0.1, samples=14)
    return Calibration(topology=topology.name, topology_hash=topology.content_hash(), source="local", host="here",
                       code_version="test", links={"inter": fit}, collectives={"allreduce": {"inter": {2: fit}}},
                       overheads=Overheads(per_op_s=5e-7, per_step_s=1.5e-3, per_transfer_s=3e-4))


@pytest.fixture
def folders(tmp_path, monkeypatch):
    topologies, calibrations = tmp_path / "topologies", tmp_path / "calibrations"
    topologies.mkdir()
    calibrations.mkdir()
    (topologies / "pair.json").write_text(json.dumps(SNAPSHOT))
    monkeypatch.setenv("TAG_TOPOLOGY_DIR", str(topologies))
    monkeypatch.setenv("TAG_CALIBRATION_DIR", str(calibrations))
    monkeypatch.setenv("TAG_TOPOLOGY_SETTLE_S", "2")
    return topologies, calibrations


@pytest.fixture
def instance():
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(topology_partitions.name, ["pair"])
        yield instance


def _calibrate(instance):
    result = materialize([calibration], partition_key="pair", instance=instance, resources=build_resources())
    assert result.success
    return result.asset_materializations_for_node("calibration")[0].metadata


def _settled(path: Path) -> Path:
    past = time.time() - 60
    os.utime(path, (past, past))
    return path


def test_a_dropped_calibration_of_this_snapshot_is_stored_and_applied(folders, instance, tag_home):
    topologies, calibrations = folders
    assert materialize([cluster_topology], partition_key="pair", instance=instance,
                       resources=build_resources()).success
    metadata = _calibrate(instance)
    assert metadata["applied"].value is False and "no calibration of pair" in metadata["why"].value

    dropped = _calibration(SNAPSHOT)
    write_calibration_file(dropped, calibrations / "pair.json")
    metadata = _calibrate(instance)
    assert metadata["applied"].value is True
    assert metadata["calibration_hash"].value == dropped.calibration_hash
    assert "0.400 ms" in metadata["terms"].value  # the measured inter latency, as plans will charge it
    with store.connect(tag_home / "tag.duckdb", read_only=True) as conn:
        stored = store.list_calibrations(conn)
    assert stored.calibration_hash.tolist() == [dropped.calibration_hash] and stored.source.tolist() == ["import"]


def test_a_calibration_of_another_snapshot_is_not_applied(folders, instance, tag_home):
    topologies, calibrations = folders
    write_calibration_file(_calibration({**SNAPSHOT, "inter_gbps": 25}), calibrations / "pair.json")
    assert materialize([cluster_topology], partition_key="pair", instance=instance,
                       resources=build_resources()).success
    metadata = _calibrate(instance)
    assert metadata["applied"].value is False and "no calibration of pair" in metadata["why"].value
    with store.connect(tag_home / "tag.duckdb", read_only=True) as conn:
        assert store.list_calibrations(conn).empty


def test_the_sensor_requests_a_calibration_run_for_a_new_file_of_a_known_topology(folders, instance):
    _, calibrations = folders

    def tick(cursor):
        return calibration_sensor(build_sensor_context(instance=instance, cursor=cursor, definitions=defs))

    assert isinstance(tick(None), SkipReason)
    write_calibration_file(_calibration({**SNAPSHOT, "name": "elsewhere"}), calibrations / "elsewhere.json")
    _settled(calibrations / "elsewhere.json")
    assert isinstance(tick(None), SkipReason)  # no such topology partition
    first = _calibration(SNAPSHOT)
    write_calibration_file(first, calibrations / "pair.json")
    assert isinstance(tick(None), SkipReason)  # still settling
    _settled(calibrations / "pair.json")
    result = tick(None)
    assert isinstance(result, SensorResult)
    assert [(r.partition_key, r.run_key) for r in result.run_requests] == [
        ("pair", f"calibration:pair:{first.calibration_hash}")]
    assert isinstance(tick(result.cursor), SkipReason)  # nothing new
    second = _calibration(SNAPSHOT, latency_s=5e-4)
    write_calibration_file(second, calibrations / "pair.json")
    _settled(calibrations / "pair.json")
    again = tick(result.cursor)
    assert [r.run_key for r in again.run_requests] == [f"calibration:pair:{second.calibration_hash}"]
