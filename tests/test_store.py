"""tag_core.store on both backends: every test here runs on a DuckDB file and on a real PostgreSQL server
(a fresh database each), through the same functions the stages call."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from tag_core import store
from tag_core.errors import TagInputError


@pytest.fixture(params=["duckdb", "postgres"])
def location(request, tmp_path: Path) -> str:
    """Where a test's store is: a DuckDB file's path or a PostgreSQL database's URL."""
    if request.param == "duckdb":
        return str(tmp_path / "store.duckdb")
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def conn(location: str):
    with store.connect(location) as connection:
        yield connection


def plan_json(model: str = "m", topology: str = "t", time_s: float = 0.5, snapshot_hash: str = "s1") -> dict:
    return {"model": model, "topology": topology, "oom": False, "speedup_vs_dp_nccl": 1.5,
            "tag": {"iteration_time_s": time_s}, "baselines": {"dp_nccl": {"iteration_time_s": 0.75}},
            "lineage": {"graph_hash": "g", "topology_hash": snapshot_hash, "seed": 3, "budget": {"iterations": 10}},
            "topology_snapshot": {"hash": snapshot_hash, "snapshot": {"name": topology}}}


def graph_rows() -> tuple[dict, list[dict], list[dict], list[dict]]:
    model = {"model": "m", "batch_size": 8, "source_hash": "src", "graph_hash": "g", "graph_file": "sha256/x",
             "step_file": None, "summary": {"ops": 2}}
    ops = [{"name": n, "type": "MatMul", "output_bytes": 64, "flops": 10 * i, "parameter_bytes": 0,
            "is_parameter": False, "is_gradient": i == 1, "is_apply": False, "is_input": i == 0,
            "batch_scaled": True, "variable": None, "other_variables": ("w",) if i else ()}
           for i, n in enumerate(["x", "y"])]
    edges = [{"src": 0, "dst": 1, "bytes": 64, "batch": True, "tensor": "x:0"}]
    # Names out of alphabetical order: the capture order must survive on both backends.
    variables = [{"name": n, "shape": (4, i + 1), "dtype": "float32", "bytes": 16 * (i + 1), "trainable": True,
                  "owner": "y", "gradient_op": "y"} for i, n in enumerate(["zeta", "alpha", "mid"])]
    return model, ops, edges, variables


def test_the_schema_is_made_once_at_this_version(location: str, conn) -> None:
    assert conn.execute("SELECT version FROM schema_info").fetchall() == [(store.SCHEMA_VERSION,)]
    with store.connect(location) as again:  # a second open changes nothing
        assert again.execute("SELECT count(*) FROM schema_info").fetchone()[0] == 1


def test_an_op_graph_reads_back_as_written(conn) -> None:
    model, ops, edges, variables = graph_rows()
    store.save_op_graph(conn, model, ops, edges, variables)
    store.save_op_graph(conn, model, ops, edges, variables)  # a recapture replaces, not appends
    record, op_rows, edge_rows, variable_rows = store.op_graph_rows(conn, "m")
    assert record["summary"] == {"ops": 2} and record["graph_file"] == "sha256/x"
    assert [row[0] for row in op_rows] == ["x", "y"] and op_rows[1][-1] == ("w",) and op_rows[0][-1] == ()
    assert [tuple(row) for row in edge_rows] == [(0, 1, 64, True, "x:0")]
    assert [row[0] for row in variable_rows] == ["zeta", "alpha", "mid"]
    assert variable_rows[1][1] == (4, 2)
    assert store.list_captured_models(conn) == ["m"]
    store.save_op_groups(conn, "m", "g", {"group_time_us": [1.0, 2.0], "seed": 1}, "gh")
    assert store.load_op_groups(conn, "m") == {"graph_hash": "g", "groups_hash": "gh",
                                               "groups": {"group_time_us": [1.0, 2.0], "seed": 1}}


def test_profiles_replace_their_keys_and_summarise(conn) -> None:
    def rows(scale: float) -> pd.DataFrame:
        return pd.DataFrame([{"model": "m", "op": op, "device_type": "cpu", "batch_size": 8, "run": run,
                              "time_us": scale * (i + 1), "host": "h", "tf_version": "2.x",
                              "profiled_at": pd.Timestamp("2026-01-01")}
                             for i, op in enumerate(["x", "y"]) for run in range(2)])

    steps = pd.DataFrame([{"model": "m", "device_type": "cpu", "batch_size": 8, "run": run, "step_us": 10.0 + run,
                           "kernel_us": 3.0, "other_kernel_us": 0.0, "nodes": 2, "graph_nodes": 2,
                           "dispatch_us": 1.0, "launch_us": 1.0, "threads": 1, "grappler": True,
                           "trace_level": "full", "host": "h", "tf_version": "2.x",
                           "profiled_at": pd.Timestamp("2026-01-01")} for run in range(2)])
    assert store.replace_profiles(conn, rows(1.0), steps) == 4
    first = store.profile_set_hash(conn, "m")
    store.replace_profiles(conn, rows(2.0))
    loaded = store.load_profiles(conn, "m")
    assert len(loaded) == 4 and sorted(loaded.time_us) == [2.0, 2.0, 4.0, 4.0] and loaded.overhead_us.isna().all()
    assert store.profile_set_hash(conn, "m") not in (None, first)
    summary = store.profile_summary(conn, "m").iloc[0]
    assert (summary.ops, summary.runs, summary.step_op_time_us) == (2, 2, 6.0)
    assert pd.isna(summary.measured_step_us)  # the replacement left no steps behind
    store.replace_profiles(conn, rows(1.0), steps)
    assert store.profile_summary(conn).iloc[0].measured_step_us == pytest.approx(10.5)


def test_a_plan_lands_once_and_the_newest_is_current(conn) -> None:
    store.save_plan_with_snapshot(conn, "p1", plan_json(time_s=0.5), "cli", "t.json")
    store.save_plan_with_snapshot(conn, "p1", plan_json(time_s=0.5), "cli", "t.json")  # a retried step
    time.sleep(0.01)
    store.save_plan(conn, "p2", plan_json(time_s=0.4), "dagster")
    store.save_plan(conn, "q1", plan_json(model="other", topology="u"), "dagster")
    plans = store.load_plans(conn, "m")
    assert list(plans.plan_id) == ["p2", "p1"] and store.has_plan(conn, "p1")
    assert json.loads(plans.plan.iloc[0])["tag"]["iteration_time_s"] == 0.4
    assert store.latest_plan(conn, "m", "t")[0] == "p2"
    assert list(store.current_plans(conn).plan_id) == ["p2", "q1"]
    store.retire_topology(conn, "u", None)
    assert list(store.current_plans(conn).plan_id) == ["p2"] and store.retired_topologies(conn) == {"u"}
    store.reinstate_topology(conn, "u")
    assert len(store.current_plans(conn)) == 2
    lineage = store.plan_lineage(conn, "m", "t")
    assert list(lineage.plan_id) == ["p1", "p2"] and list(lineage.snapshot_file) == ["t.json", "t.json"]
    assert store.latest_topology_snapshot(conn, "t") == {"content_hash": "s1", "snapshot": {"name": "t"},
                                                          "source_file": "t.json"}


def test_a_plan_and_its_snapshot_land_together_or_not_at_all(conn) -> None:
    broken = plan_json()
    del broken["tag"]  # fails after the snapshot's insert, inside the transaction
    with pytest.raises(KeyError):
        store.save_plan_with_snapshot(conn, "p1", broken, "cli", "t.json")
    assert store.latest_topology_snapshot(conn, "t") is None and store.load_plans(conn).empty


def test_fusion_plans_and_sfb_decisions_replace(conn) -> None:
    fusion = {"patterns": [["MatMul", "BiasAdd"]], "ops_fused": 2, "kernels_before": 5, "kernels_after": 4}
    store.save_fusion_plan(conn, "m", "g", fusion)
    store.save_fusion_plan(conn, "m", "g", fusion)
    assert store.load_fusion_plan(conn, "m") == fusion and store.load_fusion_plan(conn, "m", "other") is None
    gradient = {"variable": "w", "gradient_op": "gw", "op_types": ["MatMul"], "duplicated": ["a"],
                "gathered": ["b"], "estimated_saving_s": 0.1, "sync_saved_s": 0.2, "extra_compute_s": 0.05,
                "gather_s": 0.05}
    store.save_sfb_decisions(conn, "m", "t", "p1", [gradient, {**gradient, "variable": "v",
                                                               "estimated_saving_s": 0.3}])
    assert list(store.load_sfb_decisions(conn, "m", "t").variable) == ["v", "w"]
    store.save_sfb_decisions(conn, "m", "t", "p2", [])
    assert store.load_sfb_decisions(conn, "m", "t").empty


def test_calibrations_and_measured_steps(conn) -> None:
    record = {"calibration_hash": "c1", "topology": "t", "topology_hash": "s1", "source": "local", "host": "h",
              "code_version": "v", "terms": {"latency_s": 1e-5}}
    samples = pd.DataFrame([{"kind": "allreduce", "link": "intra", "group_size": 2, "bytes": 1 << i, "run": 0,
                             "seconds": 1e-4 * i} for i in range(3)])
    store.save_calibration(conn, record, samples)
    store.save_calibration(conn, record, samples)
    assert store.latest_calibration(conn, "t")["terms"] == {"latency_s": 1e-5}
    assert store.load_calibration(conn, "c1")["source"] == "local" and store.latest_calibration(conn, "x") is None
    assert list(store.list_calibrations(conn).samples) == [3]
    assert list(store.calibration_samples(conn, "c1").bytes) == [1, 2, 4]
    for predicted in (0.1, float("inf"), None):
        store.save_measured_step(conn, {"model": "m", "topology": "t", "strategy": "tag", "topology_hash": "s1",
                                        "calibration_hash": None, "steps": 5, "predicted_s": predicted,
                                        "measured_s": 0.12})
    assert store.predicted_and_measured(conn, "t", "s1", None) == [(0.1, 0.12)]
    assert store.predicted_and_measured(conn, "t", "s1", "c1") == []
    assert len(store.load_measured_steps(conn, topology="t")) == 3


def test_training_runs_and_their_lineage(conn) -> None:
    store.save_plan_with_snapshot(conn, "p1", plan_json(), "cli", "t.json")
    row = {column: None for column in store.TRAINING_COLUMNS[:-1]}
    row.update(run_id="r1", model="m", topology="t", plan_id="p1", topology_hash="s1", status="done", steps=10,
               first_step=0, run_dir="/runs/a", validation={"loss": 0.5}, loss_curve=[1.0, 0.5])
    store.save_training_run(conn, row)
    store.save_training_run(conn, {**row, "final_loss": 0.4})
    runs = store.load_training_runs(conn, run_dir="/runs/a")
    assert len(runs) == 1 and runs.loss_curve.iloc[0] == [1.0, 0.5] and runs.final_loss.iloc[0] == 0.4
    (lineage,) = store.trained_lineage(conn, "/runs/a")
    assert lineage["snapshot_file"] == "t.json" and lineage["speedup_vs_dp_nccl"] == 1.5


def test_a_newer_schema_is_refused_with_one_line(location: str, conn) -> None:
    conn.execute("UPDATE schema_info SET version = ?", [store.SCHEMA_VERSION + 1])
    conn.close()
    for read_only in (False, True):
        with pytest.raises(TagInputError) as error:
            store.connect(location, read_only=read_only)
        assert str(error.value) == (f"database: schema version {store.SCHEMA_VERSION + 1} is newer than this "
                                    f"TAG's ({store.SCHEMA_VERSION}); upgrade TAG to use it")


def test_concurrent_writers_all_land(location: str, conn) -> None:
    errors: list[BaseException] = []

    def write(worker: int) -> None:
        try:
            with store.connect(location) as own:
                for index in range(5):  # every writer replaces the same snapshot row and the same graph
                    store.save_plan_with_snapshot(own, f"w{worker}-{index}", plan_json(), "bench", None)
                    store.save_op_graph(own, *graph_rows())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(store.load_plans(conn)) == 20
    assert conn.execute("SELECT count(*) FROM topology_snapshots").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM ops").fetchone()[0] == 2  # replaced, never doubled


def test_copying_tables_between_backends(conn, tmp_path: Path, postgres_url: str) -> None:
    model, ops, edges, variables = graph_rows()
    store.save_op_graph(conn, model, ops, edges, variables)
    store.save_plan_with_snapshot(conn, "p1", plan_json(), "cli", "t.json")
    other = str(tmp_path / "other.duckdb") if getattr(conn, "backend", "duckdb") == "postgres" else postgres_url
    with store.connect(other) as copy:
        counts = store.copy_tables(conn, copy, exclude={"plans"})
        assert counts["ops"] == 2 and counts["variables"] == 3 and "plans" not in counts
        assert store.op_graph_rows(copy, "m")[3] == store.op_graph_rows(conn, "m")[3]
        assert store.latest_topology_snapshot(copy, "t")["source_file"] == "t.json" and store.load_plans(copy).empty


def test_an_older_duckdb_file_upgrades_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as old:  # what release 1 made: no variables.position, version 1
        old.execute("CREATE TABLE schema_info (version INTEGER NOT NULL)")
        old.execute("INSERT INTO schema_info VALUES (1)")
        old.execute("CREATE TABLE variables (model TEXT NOT NULL, name TEXT NOT NULL, shape JSON, dtype TEXT, "
                    "bytes BIGINT, trainable BOOLEAN, owner TEXT, gradient_op TEXT)")
        old.execute("INSERT INTO variables VALUES ('m', 'zeta', '[1]', 'f', 4, true, 'y', 'y'), "
                    "('m', 'alpha', '[2]', 'f', 8, true, 'y', 'y')")
    with store.connect(path, read_only=True) as conn:  # even a read upgrades a writable file
        assert conn.execute("SELECT version FROM schema_info").fetchall() == [(store.SCHEMA_VERSION,)]
        assert conn.execute("SELECT name FROM variables ORDER BY position").fetchall() == [("zeta",), ("alpha",)]
        assert store.current_plans(conn).empty  # the tables release 1 lacked exist now


def test_store_urls_of_unknown_schemes_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAG_STORE", "mysql://tag@db/tag")
    with pytest.raises(TagInputError) as error:
        store.connect()
    assert str(error.value) == ("TAG_STORE: unknown store scheme 'mysql' in mysql://tag@db/tag; "
                                "use a DuckDB file's path or a postgresql:// URL")
    with pytest.raises(TagInputError, match=r"^--db: unknown store scheme 's3'"):
        store.connect("s3://bucket/tag.duckdb")


def test_an_unreachable_server_is_named_after_a_bounded_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    from tag_pipelines.devserver import free_port

    monkeypatch.setenv("TAG_STORE", f"postgresql://tag:secret@127.0.0.1:{free_port()}/tag")
    monkeypatch.setenv("TAG_STORE_WAIT_S", "1")
    with pytest.raises(TagInputError) as error:
        store.connect()
    message = str(error.value)
    assert message.startswith("TAG_STORE: cannot reach postgresql://tag:***@127.0.0.1:") and "\n" not in message
    assert "after 1 s (TAG_STORE_WAIT_S)" in message and "secret" not in message
