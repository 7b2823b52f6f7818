"""The Dagster code location: assets materialize into DuckDB, definitions validate, bad keys fail cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from dagster import DagsterInstance, instance_for_test, materialize

from assets.capture import training_graph
from assets.profiling import op_profiles
from tag_core import artifacts, store
from tag_core.capture import load_step, resolve_model
from tag_core.errors import TagInputError
from tag_pipelines.definitions import defs
from tag_pipelines.partitions import model_partitions, model_topology_partitions
from tag_pipelines.resources import ProfilingSettings, build_resources

ROOT = Path(__file__).resolve().parents[1]
MODEL = "mlp[features=16,hidden=8]"
BATCH_SIZES, RUNS = [2, 4], 2


@pytest.fixture
def tag_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TAG_HOME", str(tmp_path / "tag_home"))
    return tmp_path / "tag_home"


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


def run_assets(instance: DagsterInstance, key: str, selection: list, **kwargs):
    instance.add_dynamic_partitions(model_partitions.name, [key])
    # Built after TAG_HOME is set: the DuckDB path is fixed when the resource is made.
    return materialize(selection, partition_key=key, instance=instance, resources=build_resources(), **kwargs)


@pytest.mark.slow
def test_assets_materialize_into_duckdb(tag_home: Path, instance: DagsterInstance) -> None:
    # Profiling settings come through run config, as a user would change them.
    run_config = {
        "resources": {"profiling": {"config": {"batch_sizes": BATCH_SIZES, "runs": RUNS, "warmup": 1}}}
    }
    result = run_assets(instance, MODEL, [training_graph, op_profiles], run_config=run_config)
    assert result.success

    graph_meta = result.asset_materializations_for_node("training_graph")[0].metadata
    profile_meta = result.asset_materializations_for_node("op_profiles")[0].metadata

    with store.connect(tag_home / "tag.duckdb", read_only=True) as conn:
        record = store.captured_model(conn, MODEL)
        ops = conn.execute("SELECT count(*) FROM ops WHERE model = ?", [MODEL]).fetchone()[0]
        edges = conn.execute("SELECT count(*) FROM edges WHERE model = ?", [MODEL]).fetchone()[0]
        per_op = conn.execute(
            "SELECT batch_size, op, count(*) FROM op_profiles WHERE model = ? GROUP BY ALL", [MODEL]
        ).fetchall()
        profile_rows = conn.execute("SELECT count(*) FROM op_profiles WHERE model = ?", [MODEL]).fetchone()[0]
        profile_hash = store.profile_set_hash(conn, MODEL)

    # training_graph: the OpGraph landed and the metadata describes it.
    assert ops > 0 and edges > 0
    assert graph_meta["ops"].value == ops
    assert graph_meta["edges"].value == edges
    assert graph_meta["graph_hash"].value == record["graph_hash"]
    # 16*8+8 + 8*8+8 + 8*10+10 trainable parameters (features -> hidden -> hidden -> classes)
    assert graph_meta["parameters"].value == 16 * 8 + 8 + 8 * 8 + 8 + 8 * 10 + 10
    assert graph_meta["flops_per_step"].value > 0
    assert Path(graph_meta["graph_file"].value).is_file()
    assert Path(graph_meta["graph_file"].value).is_relative_to(artifacts.root())  # where any worker reads it
    assert load_step(record["step_file"]).batch_size == record["batch_size"]
    graph_event = instance.get_latest_materialization_event(training_graph.key)
    assert graph_event.asset_materialization.tags["dagster/data_version"] == record["graph_hash"]

    # op_profiles: every op at every batch size, once per recorded run (warm-up not stored).
    assert {batch for batch, _, _ in per_op} == set(BATCH_SIZES)
    assert {count for _, _, count in per_op} == {RUNS}
    assert len(per_op) == ops * len(BATCH_SIZES)
    assert profile_meta["rows"].value == profile_rows == ops * len(BATCH_SIZES) * RUNS
    assert profile_meta["batch_sizes"].value == BATCH_SIZES
    assert profile_meta["device_type"].value
    assert profile_meta["profile_set_hash"].value == profile_hash
    assert "step_op_time_us" in profile_meta["summary"].value


def test_definitions_wiring() -> None:
    graph = defs.resolve_asset_graph()
    for key, group in (("training_graph", "capture"), ("op_profiles", "profile")):
        assets_def = defs.resolve_assets_def(key)
        assert assets_def.partitions_def == model_partitions
        assert assets_def.group_names_by_key[assets_def.key] == group
        # No pool: computing never holds the store, and each write waits for the file (open_store).
        assert assets_def.op.pool is None
    assert graph.get(op_profiles.key).parent_keys == {training_graph.key}
    assert set(defs.resources) >= {"duckdb", "profiling"}
    assert model_topology_partitions.partition_dimension_names == ["model", "topology"]


def test_profiling_settings_defaults() -> None:
    settings = ProfilingSettings()
    assert (settings.batch_sizes, settings.runs, settings.warmup) == ([1, 2, 4, 8], 5, 2)


def test_bad_model_key_fails_with_one_line_message(tag_home: Path, instance: DagsterInstance) -> None:
    with pytest.raises(TagInputError) as expected:
        resolve_model("no_such_model")

    result = run_assets(instance, "no_such_model", [training_graph], raise_on_error=False)

    assert not result.success
    (failure,) = result.get_step_failure_events()
    description = failure.step_failure_data.user_failure_data.description
    assert description == str(expected.value)
    assert "\n" not in description and "no_such_model" in description
    # Nothing written: the key is rejected before the store is opened.
    assert not (tag_home / "tag.duckdb").exists()


@pytest.mark.slow
def test_definitions_validate() -> None:
    dagster = Path(sys.executable).with_name("dagster")
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    done = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "passed validation" in done.stdout + done.stderr


def test_demo_runs_a_partition_in_process_and_reports_its_stages(
    tag_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The demo's worker step (one run of one partition through the code location's asset job) and its
    progress, read back from the instance's event log; a topology partition keeps it free of TensorFlow."""
    import json
    import uuid

    from tag_core.cluster import load_topology
    from tag_pipelines.demo import stages
    from tag_pipelines.demo_runs import DEMO_TAG, Progress, Work, execute, pair_work
    from tag_pipelines.partitions import topology_partitions

    topologies = tmp_path / "topologies"
    topologies.mkdir()
    (topologies / "pair.json").write_text(json.dumps(
        {"name": "pair", "inter_gbps": 10, "machines": [{"name": "a", "gpu": "T4", "count": 2, "intra_gbps": 50}]}))
    monkeypatch.setenv("TAG_TOPOLOGY_DIR", str(topologies))
    assert stages(topology_partitions) == ("cluster_topology", "calibration")
    assert pair_work("mlp", "pair", ()).tags("x") == {
        DEMO_TAG: "x", "dagster/partition": "mlp|pair", "dagster/partition/model": "mlp",
        "dagster/partition/topology": "pair"}

    demo_id = uuid.uuid4().hex[:12]
    with DagsterInstance.get() as instance:
        instance.add_dynamic_partitions(topology_partitions.name, ["pair"])
        run_id, ok, why = execute(Work("topology", "pair", stages(topology_partitions)), demo_id, {}, "in_process")
        assert (ok, why) == (True, "")
        run = instance.get_run_by_id(run_id)
        assert run.tags[DEMO_TAG] == demo_id and run.tags["dagster/partition"] == "pair"
        Progress(instance, demo_id).poll()
    printed = capsys.readouterr().out
    for stage in ("cluster_topology", "calibration"):
        assert f"start  {stage} [pair]" in printed and f"done   {stage} [pair] in " in printed
    # The run loaded the code location this process already imported: its store is where defs points.
    with store.connect(defs.resources["duckdb"].database, read_only=True) as conn:
        stored = store.latest_topology_snapshot(conn, "pair")
    assert stored["content_hash"] == load_topology(topologies / "pair.json").content_hash()
