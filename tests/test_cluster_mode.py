"""Cluster mode for real: PostgreSQL, Redis and two Celery workers, each with its own empty TAG_HOME, sharing
only the store's URL and the artifact root. The demo's partitions run on them; then a worker is killed with
SIGKILL in the middle of a step, and the run still completes with one row per plan."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from dagster import DagsterEventType, DagsterInstance, MultiPartitionKey, instance_for_test, materialize

from assets.planning import deployment_plan
from tag_core import store
from tag_pipelines import local_cluster
from tag_pipelines.devserver import ROOT
from tag_pipelines.partitions import model_partitions, topology_partitions
from tag_pipelines.resources import build_resources

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MODEL = "mlp[features=8,hidden=8]"
TOPOLOGIES = {
    "two-boxes": {"name": "two-boxes", "inter_gbps": 25, "machines": [
        {"name": "box-a", "gpu": "V100-16GB", "count": 2, "intra_gbps": 100},
        {"name": "box-b", "gpu": "T4", "count": 2, "intra_gbps": 64}]},
    "one-box": {"name": "one-box", "inter_gbps": 10, "machines": [
        {"name": "box", "gpu": "T4", "count": 4, "intra_gbps": 64}]},
}
# Short, so that the killed worker's step comes back within the test; longer than this test's steps.
VISIBILITY_S = 40


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]

    def worker_pid(self, name: str) -> int:
        return int((self.root / "pids" / f"{name.removeprefix('tag-')}.pid").read_text())

    def worker_log(self, index: int) -> str:
        return (self.root / "logs" / f"worker-{index}.log").read_text(errors="replace")

    def demo(self, topologies: list[str], home: str) -> subprocess.Popen:
        sources = self.root / f"sources-{home}"
        sources.mkdir()
        for name in topologies:
            (sources / f"{name}.json").write_text(json.dumps(TOPOLOGIES[name]))
        return subprocess.Popen(
            [sys.executable, "-m", "tag_pipelines.demo", "--models", MODEL, "--topologies", str(sources / "*.json"),
             "--workers", "2"],
            cwd=ROOT, env={**self.env, "TAG_HOME": str(self.root / home)}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # Not under pytest's private temporary folder: the server runs as the `postgres` user, which must reach it.
    root = Path(tempfile.mkdtemp(prefix="tag-cluster-"))
    root.chmod(0o711)
    settings = local_cluster.up(root, workers=2, with_dagster=False, visibility_s=VISIBILITY_S)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("TAG_", "DAGSTER_"))}
    try:
        yield Cluster(root, {**env, **settings, "TF_CPP_MIN_LOG_LEVEL": "2"})
    finally:
        local_cluster.down(root)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def instance(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[DagsterInstance]:
    monkeypatch.setenv("DAGSTER_PG_URL", cluster.env["DAGSTER_PG_URL"])
    with DagsterInstance.from_config(cluster.env["DAGSTER_HOME"]) as instance:
        yield instance


def finish(process: subprocess.Popen, timeout_s: float = 1200) -> str:
    output, _ = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, output[-4000:]
    return output


def pg_store(cluster: Cluster):
    return store.connect(cluster.env["TAG_STORE"])


def test_two_workers_share_only_the_store_and_the_artifacts(cluster: Cluster, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    output = finish(cluster.demo(["two-boxes", "one-box"], "orchestrator"))
    assert "FAILED" not in output
    logs = [cluster.worker_log(1), cluster.worker_log(2)]
    for text in [output, *logs]:
        assert "locked" not in text.lower() and "StoreBusy" not in text
    assert all("succeeded in" in log for log in logs), "both workers ran steps"
    assert not glob.glob(str(cluster.root / "**" / "*.duckdb"), recursive=True), "no DuckDB file anywhere"

    with pg_store(cluster) as conn:
        plans = store.load_plans(conn, MODEL)
        copy = tmp_path / "copy.duckdb"
        with store.connect(copy) as duck:  # every input of a plan, none of the plans (they warm-start a replan)
            store.copy_tables(conn, duck, exclude={"plans", "sfb_decisions", "measured_steps", "training_runs"})
    assert sorted(plans.topology) == ["one-box", "two-boxes"]

    # The same stage on DuckDB with the same inputs and seeds makes the same plans.
    for name in ("TAG_STORE", "TAG_ENV"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TAG_HOME", str(tmp_path / "laptop"))
    monkeypatch.setenv("TAG_ARTIFACTS", cluster.env["TAG_ARTIFACTS"])
    config = {"ops": {"deployment_plan": {"config": {"budget_iterations": 100}}}}
    with instance_for_test() as laptop:
        laptop.add_dynamic_partitions(model_partitions.name, [MODEL])
        laptop.add_dynamic_partitions(topology_partitions.name, list(TOPOLOGIES))
        for topology in TOPOLOGIES:
            key = MultiPartitionKey({"model": MODEL, "topology": topology})
            assert materialize([deployment_plan], partition_key=key, instance=laptop, run_config=config,
                               resources=build_resources(copy, env="local")).success
    with store.connect(copy, read_only=True) as duck:
        replans = store.load_plans(duck, MODEL)
    for topology in TOPOLOGIES:
        ours = json.loads(plans[plans.topology == topology].iloc[0].plan)
        theirs = json.loads(replans[replans.topology == topology].iloc[0].plan)
        assert ours["tag"] == theirs["tag"]  # the strategy and its predicted times
        assert ours["baselines"] == theirs["baselines"]


def test_a_worker_killed_mid_step_loses_nothing(cluster: Cluster, instance: DagsterInstance) -> None:
    with pg_store(cluster) as conn:
        before = set(store.load_plans(conn, MODEL).plan_id)
    process = cluster.demo(["one-box"], "orchestrator-2")
    killed = None
    deadline = time.monotonic() + 600
    while killed is None and time.monotonic() < deadline and process.poll() is None:
        for record in instance.get_run_records():
            if record.dagster_run.is_finished:
                continue
            for entry in instance.all_logs(record.dagster_run.run_id, of_type=DagsterEventType.ENGINE_EVENT):
                if entry.step_key == "op_profiles" and "in celery worker" in entry.message:
                    worker = entry.dagster_event.engine_event_data.metadata["Celery worker"].value
                    killed = worker.split("@")[0]
                    os.killpg(cluster.worker_pid(killed), signal.SIGKILL)
                    break
            if killed:
                break
        time.sleep(0.2)
    assert killed, "no op_profiles step was seen starting on a worker"
    output = finish(process)
    assert "FAILED" not in output
    survivor = 2 if killed.endswith("1") else 1
    assert "succeeded in" in cluster.worker_log(survivor)
    with pg_store(cluster) as conn:
        plans = store.load_plans(conn, MODEL)
    assert plans.plan_id.is_unique
    new = plans[~plans.plan_id.isin(before)]
    assert list(new.topology) == ["one-box"]  # this run's plan, once
