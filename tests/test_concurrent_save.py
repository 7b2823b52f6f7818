"""A finished search is never lost: `tag plan` waits for a store another process holds, and when the wait runs
out it keeps the plan in a file that `tag plans import` stores later."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest

from tag_core import store
from tag_core.cli import main

MODEL = "mlp[features=16,hidden=8]"
HOLD_S = 20


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A store with the model captured and profiled, and a small topology."""
    tmp = tmp_path_factory.mktemp("concurrent")
    topology = tmp / "pair.json"
    topology.write_text(json.dumps({"name": "pair", "inter_gbps": 10, "machines": [
        {"name": "a", "gpu": "T4", "count": 2, "intra_gbps": 50}, {"name": "b", "gpu": "T4", "count": 2,
                                                                   "intra_gbps": 50}]}))
    home = tmp / "home"
    os.environ["TAG_HOME"], before = str(home), os.environ.get("TAG_HOME")
    try:
        assert main(["plan", MODEL, "--topology", str(topology), "--budget-iterations", "2", "--groups", "4",
                     "--batch-size", "8", "--prior", "uniform"]) == 0
    finally:
        os.environ.pop("TAG_HOME") if before is None else os.environ.__setitem__("TAG_HOME", before)
    return home, topology


def _plans(db: Path) -> list[tuple[str, str]]:
    with duckdb.connect(str(db), read_only=True) as conn:
        return conn.execute("SELECT plan_id, source FROM plans ORDER BY created_at").fetchall()


def _hold(db: Path, seconds: float) -> subprocess.Popen:
    """Another process that holds the store's file lock for `seconds`, then lets go."""
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(db)!r}); "
                               f"print('held', flush=True); time.sleep({seconds}); c.close()"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def _plan_process(home: Path, topology: Path, *extra: str, wait_s: float) -> subprocess.Popen:
    env = {**os.environ, "TAG_HOME": str(home), "TAG_STORE_WAIT_S": str(wait_s)}
    command = [sys.executable, "-m", "tag_core.cli", "plan", MODEL, "--topology", str(topology), "--groups", "4",
               "--batch-size", "8", "--prior", "uniform", "--budget-seconds", "6", *extra]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _hold_once_searching(plan: subprocess.Popen, db: Path, seconds: float) -> tuple[list[str], subprocess.Popen, threading.Thread]:
    """Read the plan's stderr until its search bar shows (its first store visit is over), then take the store.
    A thread reads all of stderr (the list gets it at the end); the caller reads stdout with `_finish`."""
    err: list[str] = []
    started = threading.Event()

    def read():
        buffer = ""
        while chunk := plan.stderr.read(1):
            buffer += chunk
            if "plan mlp" in buffer:
                started.set()
        err.append(buffer)
        started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert started.wait(240) and plan.poll() is None, "the plan ended before its search began"
    holder = _hold(db, seconds)
    return err, holder, reader


def _finish(plan: subprocess.Popen, reader: threading.Thread) -> str:
    out = plan.stdout.read()
    plan.wait(timeout=300)
    reader.join(timeout=60)
    return out


@pytest.mark.slow
def test_a_plan_waits_for_a_busy_store_and_lands_when_it_is_free(prepared, tmp_path):
    home, topology = prepared
    db = home / "tag.duckdb"
    before = len(_plans(db))
    plan = _plan_process(home, topology, wait_s=120)
    err, holder, reader = _hold_once_searching(plan, db, HOLD_S)
    held_at = time.monotonic()
    _finish(plan, reader)
    holder.wait(timeout=60)
    assert plan.returncode == 0, err
    assert time.monotonic() - held_at >= HOLD_S - 1  # it did wait for the holder
    assert "tag: waiting up to 120 s for the store" in "".join(err)
    rows = _plans(db)
    assert len(rows) == before + 1 and rows[-1][1] == "cli"


@pytest.mark.slow
def test_a_plan_past_the_wait_is_kept_in_a_file_and_imported_later(prepared, tmp_path, capsys):
    home, topology = prepared
    db = home / "tag.duckdb"
    before = _plans(db)
    plan = _plan_process(home, topology, "--json", wait_s=1)
    err, holder, reader = _hold_once_searching(plan, db, 60)
    try:
        out = _finish(plan, reader)
    finally:
        holder.kill()
        holder.wait()
    error = "".join(err).strip().splitlines()[-1]
    assert plan.returncode == 1 and error.startswith("tag: error: TAG_HOME:"), error
    assert "locked by another process" in error and "after waiting 1 s" in error
    kept = Path(error.split("the plan is kept in ")[1].split(":")[0])
    assert kept.parent == home / "recovery" and json.loads(kept.read_text()) == json.loads(out)
    assert _plans(db) == before  # nothing half-written
    os.environ["TAG_HOME"], previous = str(home), os.environ.get("TAG_HOME")
    try:
        assert main(["plans", "import", str(kept)]) == 0
        assert main(["plans", "import", str(kept)]) == 0  # the same plan twice is one row
    finally:
        os.environ.pop("TAG_HOME") if previous is None else os.environ.__setitem__("TAG_HOME", previous)
    said = capsys.readouterr().out
    assert "stored plan" in said and "is already stored" in said
    rows = _plans(db)
    assert len(rows) == len(before) + 1 and rows[-1][1] == "import"
    with duckdb.connect(str(db), read_only=True) as conn:
        snapshot = store.latest_topology_snapshot(conn, "pair")
    assert snapshot["content_hash"] == json.loads(out)["topology_snapshot"]["hash"]
