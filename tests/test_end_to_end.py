"""End to end through a real `dagster dev`: drop a topology file, get a plan, with nothing else done.

The daemon's sensors register the model and the snapshot, and eager automation
carries them to `deployment_plan`. Marked slow; CI runs it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import duckdb
import pytest

from tag_core import store
from tag_core.cluster import parse_topology
from tag_pipelines.devserver import prepare_dagster_home, start_dagster_dev, wait_for

MODEL = "mlp[features=8,hidden=8]"
SNAPSHOT = {
    "name": "two-boxes",
    "machines": [
        {"name": "box-a", "gpu": "V100-16GB", "count": 2, "intra_gbps": 100},
        {"name": "box-b", "gpu": "T4", "count": 2, "intra_gbps": 64},
    ],
    "inter_gbps": 25,
}


def plan_rows(database: Path, topology: str) -> list[dict]:
    if not database.exists():
        return []
    try:
        conn = duckdb.connect(str(database), read_only=True)
    except duckdb.Error:  # a run holds the write lock; look again later
        return []
    try:
        return store.load_plans(conn, topology=topology).to_dict("records")
    except duckdb.Error:
        return []
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_dropping_a_topology_file_produces_a_plan(tmp_path):
    home, watched = tmp_path / "tag_home", tmp_path / "topologies"
    watched.mkdir()
    registry = tmp_path / "models.yaml"
    registry.write_text(f"models:\n  - {MODEL}\n")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(prepare_dagster_home(tmp_path / "dagster_home")),
        "TAG_HOME": str(home),
        "TAG_TOPOLOGY_DIR": str(watched),
        "TAG_MODELS_FILE": str(registry),
        "TAG_TOPOLOGY_SETTLE_S": "1",
        "TAG_ENV": "ci",  # the code location's throwaway resources: this TAG_HOME, a short profile
    }
    server = start_dagster_dev(env, tmp_path / "dagster.log")
    try:
        database = home / "tag.duckdb"
        # The model sensor registers and captures the model on its own.
        assert wait_for(lambda: _has_groups(database), 420, server=server), _tail(server.log)

        dropped = time.monotonic()
        staging = watched / ".two-boxes.json.tmp"
        staging.write_text(json.dumps(SNAPSHOT))
        staging.rename(watched / "two-boxes.json")
        rows = wait_for(lambda: plan_rows(database, "two-boxes"), 420, server=server)
        latency = time.monotonic() - dropped
        assert rows, _tail(server.log)
        row = rows[-1]
        assert row["model"] == MODEL
        assert row["topology_hash"] == parse_topology(SNAPSHOT).content_hash()
        for column in ("graph_hash", "profile_hash", "groups_hash", "code_version"):
            assert row[column], column
        plan = json.loads(row["plan"]) if isinstance(row["plan"], str) else row["plan"]
        assert plan["tag"]["iteration_time_s"] > 0
        print(f"drop-to-plan latency: {latency:.1f} s")
    finally:
        server.stop()
    assert server.process.poll() is not None


def _has_groups(database: Path) -> bool:
    if not database.exists():
        return False
    try:
        conn = duckdb.connect(str(database), read_only=True)
    except duckdb.Error:
        return False
    try:
        return store.load_op_groups(conn, MODEL) is not None
    except duckdb.Error:
        return False
    finally:
        conn.close()


def _tail(log: Path) -> str:
    return log.read_text()[-4000:] if log.exists() else "(no log)"
