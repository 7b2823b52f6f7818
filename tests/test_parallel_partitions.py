"""Partitions materialize side by side: assets compute without the DuckDB store and take turns on the file
only to write, each waiting a bounded time (TAG_STORE_WAIT_S) for the process that holds it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, instance_for_test, materialize

from assets.cluster import cluster_topology
from tag_core import store
from tag_pipelines.devserver import ROOT
from tag_pipelines.partitions import model_partitions, topology_partitions
from tag_pipelines.resources import build_resources

MODELS = [f"mlp[features={f},hidden={h}]" for f, h in ((8, 4), (12, 6), (16, 8), (20, 4))]
TOPOLOGY = {"name": "pair", "inter_gbps": 10, "machines": [{"name": "a", "gpu": "T4", "count": 2, "intra_gbps": 50}]}
LOCK_WORDS = ("locked by another process", "Could not set lock", "StoreBusy", "Conflicting lock")


@pytest.fixture
def homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TAG_HOME", str(tmp_path / "tag_home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()
    topologies = tmp_path / "topologies"
    topologies.mkdir()
    (topologies / "pair.json").write_text(json.dumps(TOPOLOGY))
    monkeypatch.setenv("TAG_TOPOLOGY_DIR", str(topologies))
    return tmp_path


@pytest.fixture
def instance(homes: Path) -> Iterator[DagsterInstance]:
    with DagsterInstance.get() as instance:  # on DAGSTER_HOME: the worker processes see the same instance
        yield instance


@pytest.mark.slow  # 4 processes each importing TF: about 100 s on 2 busy cores
def test_four_partitions_materialize_at_once_in_separate_processes(homes: Path, instance: DagsterInstance) -> None:
    instance.add_dynamic_partitions(model_partitions.name, MODELS)
    dagster = Path(sys.executable).with_name("dagster")
    env = {**os.environ, "TAG_ENV": "ci", "TF_CPP_MIN_LOG_LEVEL": "2"}
    started = time.monotonic()
    processes = [subprocess.Popen([str(dagster), "asset", "materialize", "-m", "tag_pipelines.definitions",
                                   "--select", "training_graph", "--partition", model], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for model in MODELS]
    outputs = [p.communicate(timeout=600)[0] for p in processes]
    print(f"4 partitions in {time.monotonic() - started:.1f} s")
    for model, process, output in zip(MODELS, processes, outputs):
        assert process.returncode == 0, f"{model}:\n{output[-3000:]}"
        assert not [w for w in LOCK_WORDS if w in output], f"{model} hit the store's lock:\n{output[-3000:]}"

    with store.connect(homes / "tag_home" / "tag.duckdb", read_only=True) as conn:
        for model in MODELS:
            graph = store.captured_model(conn, model)
            assert graph is not None, f"{model} is missing from the store"
            _, ops, edges, variables = store.op_graph_rows(conn, model)
            assert ops and edges and variables
            assert graph["summary"]["ops"] == len(ops) and graph["summary"]["edges"] == len(edges)
    materialized = instance.get_materialized_partitions(AssetKey("training_graph"))
    assert materialized == set(MODELS)


def _hold_store(path: Path, seconds: float) -> subprocess.Popen:
    """Another process holding the DuckDB file open (as a running writer or a notebook would)."""
    code = ("import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('held', flush=True); "
            "time.sleep(float(sys.argv[2])); c.close()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def _topology_run(instance: DagsterInstance):
    instance.add_dynamic_partitions(topology_partitions.name, ["pair"])
    return materialize([cluster_topology], partition_key="pair", instance=instance, resources=build_resources(),
                       raise_on_error=False)


@pytest.mark.slow
def test_a_write_waits_for_the_process_holding_the_store(homes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = homes / "tag_home" / "tag.duckdb"
    store.connect(path).close()
    monkeypatch.setenv("TAG_STORE_WAIT_S", "30")
    holder = _hold_store(path, 2.0)
    with instance_for_test() as instance:
        started = time.monotonic()
        result = _topology_run(instance)
        waited = time.monotonic() - started
    holder.wait(timeout=30)
    assert result.success
    assert waited >= 1.0, "the write did not wait for the holder"
    with store.connect(path, read_only=True) as conn:
        assert store.latest_topology_snapshot(conn, "pair") is not None


@pytest.mark.slow
def test_a_wait_that_runs_out_names_the_holder(homes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = homes / "tag_home" / "tag.duckdb"
    store.connect(path).close()
    monkeypatch.setenv("TAG_STORE_WAIT_S", "1")
    holder = _hold_store(path, 30.0)
    try:
        with instance_for_test() as instance:
            result = _topology_run(instance)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE)
    message = failure.step_failure_data.user_failure_data.description
    assert f"locked by another process (pid {holder.pid})" in message
    assert message.startswith("duckdb resource: ") and "after waiting 1 s (TAG_STORE_WAIT_S)" in message
    assert "\n" not in message
