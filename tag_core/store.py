"""DuckDB schema and every SQL statement TAG runs. No SQL lives anywhere else.

Functions take an open DuckDB connection, so the CLI (`connect`) and Dagster's
`DuckDBResource` share them. Writes happen inside one transaction each.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

import duckdb
import pandas as pd

from .errors import TagInputError
from .graph import Edge, Op, OpGraph, Variable

SCHEMA_VERSION = 1

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS schema_info (version INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS models (
        model TEXT PRIMARY KEY, batch_size INTEGER NOT NULL, source_hash TEXT, graph_hash TEXT NOT NULL,
        graph_file TEXT, step_file TEXT, summary JSON, captured_at TIMESTAMP DEFAULT current_timestamp)""",
    """CREATE TABLE IF NOT EXISTS ops (
        model TEXT NOT NULL, idx INTEGER NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL,
        output_bytes BIGINT, flops BIGINT, parameter_bytes BIGINT, is_parameter BOOLEAN, is_gradient BOOLEAN,
        is_apply BOOLEAN, is_input BOOLEAN, batch_scaled BOOLEAN, variable TEXT, other_variables JSON,
        PRIMARY KEY (model, idx))""",
    # Databases made before other_variables existed gain it (their rows read as none).
    "ALTER TABLE ops ADD COLUMN IF NOT EXISTS other_variables JSON",
    """CREATE TABLE IF NOT EXISTS edges (
        model TEXT NOT NULL, src INTEGER NOT NULL, dst INTEGER NOT NULL, bytes BIGINT, batch BOOLEAN, tensor TEXT)""",
    """CREATE TABLE IF NOT EXISTS variables (
        model TEXT NOT NULL, name TEXT NOT NULL, shape JSON, dtype TEXT, bytes BIGINT, trainable BOOLEAN,
        owner TEXT, gradient_op TEXT)""",
    """CREATE TABLE IF NOT EXISTS op_profiles (
        model TEXT NOT NULL, op TEXT NOT NULL, device_type TEXT NOT NULL, batch_size INTEGER NOT NULL,
        run INTEGER NOT NULL, time_us DOUBLE NOT NULL, host TEXT, tf_version TEXT,
        profiled_at TIMESTAMP DEFAULT current_timestamp)""",
    # Planning (tag plan, op_groups / cluster_topology / deployment_plan assets).
    """CREATE TABLE IF NOT EXISTS op_group_sets (
        model TEXT PRIMARY KEY, graph_hash TEXT NOT NULL, groups_hash TEXT NOT NULL, num_groups INTEGER NOT NULL,
        seed INTEGER NOT NULL, groups JSON NOT NULL, created_at TIMESTAMP DEFAULT current_timestamp)""",
    """CREATE TABLE IF NOT EXISTS topology_snapshots (
        topology TEXT NOT NULL, content_hash TEXT NOT NULL, snapshot JSON NOT NULL, source_file TEXT,
        recorded_at TIMESTAMP DEFAULT current_timestamp, PRIMARY KEY (topology, content_hash))""",
    """CREATE TABLE IF NOT EXISTS plans (
        plan_id TEXT PRIMARY KEY, model TEXT NOT NULL, topology TEXT NOT NULL, source TEXT,
        tag_time_s DOUBLE, dp_nccl_time_s DOUBLE, speedup_vs_dp_nccl DOUBLE, oom BOOLEAN,
        graph_hash TEXT, profile_hash TEXT, groups_hash TEXT, topology_hash TEXT, checkpoint_hash TEXT,
        code_version TEXT, seed INTEGER, budget JSON, warm_start_from TEXT, plan JSON NOT NULL,
        created_at TIMESTAMP DEFAULT current_timestamp)""",
    """CREATE TABLE IF NOT EXISTS fusion_plans (
        model TEXT PRIMARY KEY, graph_hash TEXT NOT NULL, patterns INTEGER, ops_fused INTEGER,
        kernels_before INTEGER, kernels_after INTEGER, plan JSON NOT NULL, created_at TIMESTAMP DEFAULT current_timestamp)""",
    """CREATE TABLE IF NOT EXISTS sfb_decisions (
        model TEXT NOT NULL, topology TEXT NOT NULL, plan_id TEXT NOT NULL, variable TEXT NOT NULL,
        gradient_op TEXT NOT NULL, op_types JSON, duplicated JSON, gathered JSON, estimated_saving_s DOUBLE,
        sync_saved_s DOUBLE, extra_compute_s DOUBLE, gather_s DOUBLE, PRIMARY KEY (model, topology, variable))""",
    """CREATE TABLE IF NOT EXISTS topology_retirements (
        topology TEXT PRIMARY KEY, content_hash TEXT, retired_at TIMESTAMP DEFAULT current_timestamp)""",
    # Which snapshot, profile set, groups and checkpoint made each plan, and whether each is still current.
    """CREATE OR REPLACE VIEW plan_lineage AS
        SELECT p.plan_id, p.model, p.topology, p.created_at, p.source, p.tag_time_s, p.speedup_vs_dp_nccl,
               p.graph_hash, p.graph_hash = m.graph_hash AS graph_is_current,
               p.profile_hash, p.groups_hash, p.groups_hash = g.groups_hash AS groups_are_current,
               p.topology_hash, s.source_file AS snapshot_file, s.recorded_at AS snapshot_recorded_at,
               r.retired_at AS topology_retired_at, p.checkpoint_hash, p.code_version, p.seed, p.budget,
               p.warm_start_from
        FROM plans p
        LEFT JOIN models m ON m.model = p.model
        LEFT JOIN op_group_sets g ON g.model = p.model
        LEFT JOIN topology_snapshots s ON s.topology = p.topology AND s.content_hash = p.topology_hash
        LEFT JOIN topology_retirements r ON r.topology = p.topology""",
]

PROFILE_COLUMNS = ["model", "op", "device_type", "batch_size", "run", "time_us", "host", "tf_version", "profiled_at"]


def tag_home() -> Path:
    return Path(os.environ.get("TAG_HOME", ".tag"))


def default_database() -> Path:
    return tag_home() / "tag.duckdb"


def ensure_schema(conn: duckdb.DuckDBPyConnection) -> None:
    with transaction(conn):
        for statement in SCHEMA:
            conn.execute(statement)
        row = conn.execute("SELECT max(version) FROM schema_info").fetchone()
        if row[0] is None:
            conn.execute("INSERT INTO schema_info VALUES (?)", [SCHEMA_VERSION])
        elif row[0] > SCHEMA_VERSION:
            raise TagInputError("database", f"schema version {row[0]} is newer than this TAG ({SCHEMA_VERSION})")


# Never fetch or load extensions on connect: DuckDB would download sqlite_scanner to open a SQLite file.
CONNECT_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}


def connect(path: str | Path | None = None, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (and, unless read-only, create) TAG's database; an unusable file is the user's input error."""
    where = "--db" if path else "TAG_HOME"
    path = Path(path) if path else default_database()
    if path.is_dir():
        raise TagInputError(where, f"{path} is a directory, not a DuckDB database")
    if path.exists():
        _require_duckdb_file(path, where)
    elif read_only:
        raise TagInputError("database", f"{path} does not exist yet; capture or profile a model first")
    else:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # e.g. TAG_HOME is a file
            raise TagInputError(where, f"cannot create directory {str(path.parent)!r} ({exc.strerror})") from None
    try:
        conn = duckdb.connect(str(path), read_only=read_only, config=CONNECT_CONFIG)
    except duckdb.Error as exc:
        raise TagInputError(where, _open_problem(path, exc)) from None
    if not read_only:
        ensure_schema(conn)
    return conn


def _require_duckdb_file(path: Path, where: str) -> None:
    """DuckDB files carry b"DUCK" at byte 8. Checking first keeps DuckDB from opening anything else (an installed
    sqlite extension would open a SQLite file, and TAG's tables would be written into it)."""
    try:
        with path.open("rb") as file:
            head = file.read(16)
    except OSError as exc:
        raise TagInputError(where, f"cannot read {path} ({exc.strerror})") from None
    if head[8:12] != b"DUCK":
        kind = "an empty file" if not head else "a SQLite database" if head.startswith(b"SQLite format 3") else None
        raise TagInputError(where, f"{path} is not a DuckDB database" + (f" ({kind})" if kind else ""))


def _open_problem(path: Path, exc: duckdb.Error) -> str:
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "Could not set lock" in message:
        pid = re.search(r"\(PID (\d+)\)", message)
        return f"{path} is locked by another process{f' (pid {pid[1]})' if pid else ''}; close it and try again"
    return f"{path}: {message.removeprefix('IO Error: ')}"


@contextlib.contextmanager
def transaction(conn: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    conn.execute("BEGIN TRANSACTION")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


# ---- captured graphs -------------------------------------------------------


def save_op_graph(conn, graph: OpGraph, source_hash: str | None, graph_file: str | None, step_file: str | None) -> None:
    ops = pd.DataFrame([asdict(op) for op in graph.ops])
    ops["other_variables"] = ops["other_variables"].map(lambda names: json.dumps(list(names)))
    ops.insert(0, "idx", range(len(ops)))
    ops.insert(0, "model", graph.model)
    edges = pd.DataFrame([asdict(e) for e in graph.edges], columns=["src", "dst", "bytes", "batch", "tensor"])
    edges.insert(0, "model", graph.model)
    variables = pd.DataFrame([asdict(v) for v in graph.variables])
    variables["shape"] = variables["shape"].map(lambda s: json.dumps(list(s)))
    variables.insert(0, "model", graph.model)
    with transaction(conn):
        for table in ("ops", "edges", "variables", "models"):
            conn.execute(f"DELETE FROM {table} WHERE model = ?", [graph.model])
        conn.register("new_ops", ops)
        conn.execute(
            "INSERT INTO ops SELECT model, idx, name, type, output_bytes, flops, parameter_bytes, is_parameter, "
            "is_gradient, is_apply, is_input, batch_scaled, variable, other_variables FROM new_ops"
        )
        conn.register("new_edges", edges)
        conn.execute("INSERT INTO edges SELECT model, src, dst, bytes, batch, tensor FROM new_edges")
        conn.register("new_variables", variables)
        conn.execute(
            "INSERT INTO variables SELECT model, name, shape, dtype, bytes, trainable, owner, gradient_op FROM new_variables"
        )
        conn.execute(
            "INSERT INTO models (model, batch_size, source_hash, graph_hash, graph_file, step_file, summary) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [graph.model, graph.batch_size, source_hash, graph.content_hash(), graph_file, step_file,
             json.dumps(graph.summary())],
        )
        for name in ("new_ops", "new_edges", "new_variables"):
            conn.unregister(name)


def captured_model(conn, model: str) -> dict | None:
    row = conn.execute(
        "SELECT model, batch_size, source_hash, graph_hash, graph_file, step_file, summary, captured_at "
        "FROM models WHERE model = ?",
        [model],
    ).fetchone()
    if row is None:
        return None
    keys = ["model", "batch_size", "source_hash", "graph_hash", "graph_file", "step_file", "summary", "captured_at"]
    record = dict(zip(keys, row))
    record["summary"] = json.loads(record["summary"]) if record["summary"] else {}
    return record


def load_op_graph(conn, model: str) -> OpGraph:
    record = captured_model(conn, model)
    if record is None:
        raise TagInputError("model", f"{model!r} has not been captured; run `tag capture {model}` first")
    # A read-only connection to a database from before other_variables does not gain the column.
    has_others = conn.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = 'ops' "
                              "AND column_name = 'other_variables'").fetchone()[0]
    op_rows = conn.execute(
        "SELECT name, type, output_bytes, flops, parameter_bytes, is_parameter, is_gradient, is_apply, is_input, "
        f"batch_scaled, variable, {'other_variables' if has_others else 'NULL'} FROM ops WHERE model = ? ORDER BY idx",
        [model],
    ).fetchall()
    edge_rows = conn.execute(
        "SELECT src, dst, bytes, batch, tensor FROM edges WHERE model = ? ORDER BY src, dst, tensor", [model]
    ).fetchall()
    variable_rows = conn.execute(
        "SELECT name, shape, dtype, bytes, trainable, owner, gradient_op FROM variables WHERE model = ? ORDER BY rowid",
        [model],
    ).fetchall()
    return OpGraph(
        model=model,
        batch_size=record["batch_size"],
        ops=[Op(*row[:-1], other_variables=tuple(json.loads(row[-1])) if row[-1] else ()) for row in op_rows],
        edges=[Edge(*row) for row in edge_rows],
        variables=[
            Variable(name, tuple(json.loads(shape)), dtype, size, trainable, owner, gradient)
            for name, shape, dtype, size, trainable, owner, gradient in variable_rows
        ],
    )


def list_captured_models(conn) -> list[str]:
    return [row[0] for row in conn.execute("SELECT model FROM models ORDER BY model").fetchall()]


# ---- op profiles -----------------------------------------------------------


def replace_profiles(conn, rows: pd.DataFrame) -> int:
    """Insert profile rows; rows for each (model, device_type, batch_size) they cover replace the old ones."""
    rows = rows[PROFILE_COLUMNS]
    keys = rows[["model", "device_type", "batch_size"]].drop_duplicates()
    with transaction(conn):
        conn.register("profile_keys", keys)
        conn.execute(
            "DELETE FROM op_profiles p USING profile_keys k WHERE p.model = k.model "
            "AND p.device_type = k.device_type AND p.batch_size = k.batch_size"
        )
        conn.register("new_profiles", rows)
        conn.execute(f"INSERT INTO op_profiles SELECT {', '.join(PROFILE_COLUMNS)} FROM new_profiles")
        conn.unregister("profile_keys")
        conn.unregister("new_profiles")
    return len(rows)


def load_profiles(conn, model: str | None = None, device_type: str | None = None) -> pd.DataFrame:
    """Profile rows, optionally for one model and one device type."""
    clauses, params = [], []
    if model is not None:
        clauses.append("model = ?")
        params.append(model)
    if device_type is not None:
        clauses.append("device_type = ?")
        params.append(device_type)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    return conn.execute(
        f"SELECT {', '.join(PROFILE_COLUMNS)} FROM op_profiles {where} "
        "ORDER BY model, device_type, batch_size, op, run",
        params,
    ).df()


def profile_summary(conn, model: str | None = None) -> pd.DataFrame:
    where = "WHERE model = ?" if model else ""
    return conn.execute(
        "SELECT model, device_type, batch_size, count(DISTINCT op) AS ops, count(DISTINCT run) AS runs, "
        f"sum(time_us) / count(DISTINCT run) AS step_op_time_us FROM op_profiles {where} "
        "GROUP BY ALL ORDER BY model, device_type, batch_size",
        [model] if model else [],
    ).df()


def profile_set_hash(conn, model: str) -> str | None:
    row = conn.execute(
        "SELECT md5(string_agg(concat_ws('|', device_type, batch_size, op, run, time_us), ',' "
        "ORDER BY device_type, batch_size, op, run)) FROM op_profiles WHERE model = ?",
        [model],
    ).fetchone()
    return row[0][:16] if row and row[0] else None


# ---- planning: op groups, topology snapshots, plans --------------------------


def save_op_groups(conn, model: str, graph_hash: str, groups: dict, groups_hash: str) -> None:
    """The current op groups of `model` (`OpGroups.to_json()`), replacing the previous set."""
    with transaction(conn):
        conn.execute("DELETE FROM op_group_sets WHERE model = ?", [model])
        conn.execute(
            "INSERT INTO op_group_sets (model, graph_hash, groups_hash, num_groups, seed, groups) VALUES (?, ?, ?, ?, ?, ?)",
            [model, graph_hash, groups_hash, len(groups["group_time_us"]), groups["seed"], json.dumps(groups)],
        )


def load_op_groups(conn, model: str) -> dict | None:
    """{graph_hash, groups_hash, groups} of `model`'s stored groups, or None."""
    row = conn.execute("SELECT graph_hash, groups_hash, groups FROM op_group_sets WHERE model = ?", [model]).fetchone()
    return None if row is None else {"graph_hash": row[0], "groups_hash": row[1], "groups": json.loads(row[2])}


def save_topology_snapshot(conn, topology: str, content_hash: str, snapshot: dict, source_file: str | None) -> None:
    """Record a validated snapshot; the same content again only refreshes its time."""
    with transaction(conn):
        conn.execute("DELETE FROM topology_snapshots WHERE topology = ? AND content_hash = ?", [topology, content_hash])
        conn.execute(
            "INSERT INTO topology_snapshots (topology, content_hash, snapshot, source_file) VALUES (?, ?, ?, ?)",
            [topology, content_hash, json.dumps(snapshot), source_file],
        )


def latest_topology_snapshot(conn, topology: str) -> dict | None:
    """{content_hash, snapshot, source_file} most recently recorded for `topology`, or None."""
    row = conn.execute(
        "SELECT content_hash, snapshot, source_file FROM topology_snapshots WHERE topology = ? "
        "ORDER BY recorded_at DESC LIMIT 1", [topology],
    ).fetchone()
    return None if row is None else {"content_hash": row[0], "snapshot": json.loads(row[1]), "source_file": row[2]}


PLAN_COLUMNS = ["plan_id", "model", "topology", "source", "tag_time_s", "dp_nccl_time_s", "speedup_vs_dp_nccl", "oom",
                "graph_hash", "profile_hash", "groups_hash", "topology_hash", "checkpoint_hash", "code_version", "seed",
                "budget", "warm_start_from", "plan", "created_at"]


def save_plan(conn, plan_id: str, plan: dict, source: str, topology_key: str | None = None) -> None:
    """Append a plan (the plan JSON of `tag plan`) with its lineage columns; plans are never overwritten."""
    lineage = plan.get("lineage", {})
    values = [plan_id, plan["model"], topology_key or plan["topology"], source, plan["tag"]["iteration_time_s"],
              plan["baselines"]["dp_nccl"]["iteration_time_s"], plan.get("speedup_vs_dp_nccl"), plan["oom"],
              lineage.get("graph_hash"), lineage.get("profile_hash"), lineage.get("groups_hash"),
              lineage.get("topology_hash"), lineage.get("checkpoint"), lineage.get("code_version"),
              lineage.get("seed"), json.dumps(lineage.get("budget")), lineage.get("warm_start_from"), json.dumps(plan)]
    with transaction(conn):
        conn.execute(f"INSERT INTO plans ({', '.join(PLAN_COLUMNS[:-1])}) VALUES ({', '.join('?' * len(values))})", values)


def load_plans(conn, model: str | None = None, topology: str | None = None) -> pd.DataFrame:
    """Plan rows, newest first, optionally for one model and/or topology (the plan JSON stays a string)."""
    clauses, params = [], []
    for column, value in (("model", model), ("topology", topology)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    return conn.execute(f"SELECT {', '.join(PLAN_COLUMNS)} FROM plans {where} ORDER BY created_at DESC, plan_id",
                        params).df()


def latest_plan(conn, model: str, topology: str) -> tuple[str, dict] | None:
    """(plan_id, plan JSON) of the newest plan for a model and topology, or None."""
    row = conn.execute(
        "SELECT plan_id, plan FROM plans WHERE model = ? AND topology = ? ORDER BY created_at DESC LIMIT 1",
        [model, topology],
    ).fetchone()
    return None if row is None else (row[0], json.loads(row[1]))


def retire_topology(conn, topology: str, content_hash: str | None) -> None:
    """Mark a snapshot retired (its file is gone); its partition, snapshots and plans stay."""
    with transaction(conn):
        conn.execute("DELETE FROM topology_retirements WHERE topology = ?", [topology])
        conn.execute("INSERT INTO topology_retirements (topology, content_hash) VALUES (?, ?)", [topology, content_hash])


def reinstate_topology(conn, topology: str) -> None:
    with transaction(conn):
        conn.execute("DELETE FROM topology_retirements WHERE topology = ?", [topology])


def retired_topologies(conn) -> set[str]:
    return {row[0] for row in conn.execute("SELECT topology FROM topology_retirements").fetchall()}


def plan_lineage(conn, model: str, topology: str) -> pd.DataFrame:
    """The history of plans for one model × topology, oldest first, with what made each."""
    return conn.execute(
        "SELECT * FROM plan_lineage WHERE model = ? AND topology = ? ORDER BY created_at, plan_id", [model, topology]
    ).df()


def current_plans(conn) -> pd.DataFrame:
    """The newest plan of every model × topology whose snapshot is not retired."""
    return conn.execute(
        f"SELECT {', '.join('p.' + c for c in PLAN_COLUMNS)} FROM plans p "
        "LEFT JOIN topology_retirements r ON r.topology = p.topology WHERE r.topology IS NULL "
        "QUALIFY row_number() OVER (PARTITION BY p.model, p.topology ORDER BY p.created_at DESC, p.plan_id) = 1 "
        "ORDER BY p.model, p.topology"
    ).df()


def save_fusion_plan(conn, model: str, graph_hash: str, plan: dict) -> None:
    with transaction(conn):
        conn.execute("DELETE FROM fusion_plans WHERE model = ?", [model])
        conn.execute(
            "INSERT INTO fusion_plans (model, graph_hash, patterns, ops_fused, kernels_before, kernels_after, plan) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [model, graph_hash, len(plan["patterns"]), plan["ops_fused"], plan["kernels_before"],
             plan["kernels_after"], json.dumps(plan)],
        )


def load_fusion_plan(conn, model: str, graph_hash: str | None = None) -> dict | None:
    """The stored fusion plan JSON of `model` (only if made for `graph_hash`, when given)."""
    row = conn.execute("SELECT graph_hash, plan FROM fusion_plans WHERE model = ?", [model]).fetchone()
    if row is None or (graph_hash is not None and row[0] != graph_hash):
        return None
    return json.loads(row[1])


SFB_COLUMNS = ["model", "topology", "plan_id", "variable", "gradient_op", "op_types", "duplicated", "gathered",
               "estimated_saving_s", "sync_saved_s", "extra_compute_s", "gather_s"]


def save_sfb_decisions(conn, model: str, topology: str, plan_id: str, gradients: list[dict]) -> None:
    """Replace a model × topology's SFB table with a plan's chosen gradients (its JSON's `sfb.gradients`)."""
    rows = [[model, topology, plan_id, g["variable"], g["gradient_op"], json.dumps(g["op_types"]),
             json.dumps(g["duplicated"]), json.dumps(g["gathered"]), g["estimated_saving_s"], g["sync_saved_s"],
             g["extra_compute_s"], g["gather_s"]] for g in gradients]
    with transaction(conn):
        conn.execute("DELETE FROM sfb_decisions WHERE model = ? AND topology = ?", [model, topology])
        if rows:
            conn.executemany(f"INSERT INTO sfb_decisions ({', '.join(SFB_COLUMNS)}) "
                             f"VALUES ({', '.join('?' * len(SFB_COLUMNS))})", rows)


def load_sfb_decisions(conn, model: str, topology: str) -> pd.DataFrame:
    """The SFB table of a model × topology, largest estimated saving first."""
    return conn.execute(f"SELECT {', '.join(SFB_COLUMNS)} FROM sfb_decisions WHERE model = ? AND topology = ? "
                        "ORDER BY estimated_saving_s DESC, variable", [model, topology]).df()
