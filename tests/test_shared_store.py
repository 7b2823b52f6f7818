"""`tag` commands on the shared store of cluster mode: homes on different machines share only TAG_STORE
(a real PostgreSQL server) and TAG_ARTIFACTS, as `source .cluster/env` sets them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = "mlp[features=8,hidden=8]"
TOPOLOGY = ROOT / "examples" / "topologies" / "testbed.json"

pytestmark = pytest.mark.slow


def tag(home: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "tag_core.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**env, "TAG_HOME": str(home)}, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_two_empty_homes_plan_on_one_store_and_a_third_sees_both(tmp_path: Path, postgres_url: str) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TAG_")}
    env.update(TAG_STORE=postgres_url, TAG_ARTIFACTS=str(tmp_path / "artifacts"), TF_CPP_MIN_LOG_LEVEL="2",
               TAG_MODELS_FILE=str(tmp_path / "models.yaml"))
    first, second, third = (tmp_path / name for name in ("first", "second", "third"))
    tag(first, env, "capture", MODEL)
    tag(first, env, "profile", MODEL, "--batch-sizes", "4,8", "--runs", "2", "--warmup", "1")
    tag(first, env, "plan", MODEL, "--topology", str(TOPOLOGY), "--budget-iterations", "20")
    # Another machine: no capture, an empty home; the captured steps come from the artifact root.
    tag(second, env, "profile", MODEL, "--batch-sizes", "4,8", "--runs", "2", "--warmup", "1")
    tag(second, env, "plan", MODEL, "--topology", str(TOPOLOGY), "--budget-iterations", "20", "--seed", "7")
    lineage = json.loads(tag(third, env, "lineage", MODEL, TOPOLOGY.stem, "--json"))
    plans = lineage["plans"] if isinstance(lineage, dict) else lineage
    assert len(plans) == 2 and len({plan["plan_id"] for plan in plans}) == 2
    assert not list(tmp_path.rglob("*.duckdb")), "no DuckDB file anywhere"
