"""Topology snapshots, plans with their lineage, fusion plans and SFB decisions."""

from __future__ import annotations

import json

import pandas as pd

from .connection import transaction


def save_topology_snapshot(conn, topology: str, content_hash: str, snapshot: dict, source_file: str | None) -> None:
    """Record a validated snapshot; the same content again only refreshes its time."""
    with transaction(conn):
        _insert_snapshot(conn, topology, content_hash, snapshot, source_file)


def _insert_snapshot(conn, topology: str, content_hash: str, snapshot: dict, source_file: str | None) -> None:
    conn.execute("DELETE FROM topology_snapshots WHERE topology = ? AND content_hash = ?", [topology, content_hash])
    conn.execute("INSERT INTO topology_snapshots (topology, content_hash, snapshot, source_file) VALUES (?, ?, ?, ?)",
                 [topology, content_hash, json.dumps(snapshot), source_file])


def latest_topology_snapshot(conn, topology: str) -> dict | None:
    """{content_hash, snapshot, source_file} most recently recorded for `topology`, or None."""
    row = conn.execute(
        "SELECT content_hash, snapshot, source_file FROM topology_snapshots WHERE topology = ? "
        "ORDER BY recorded_at DESC LIMIT 1", [topology],
    ).fetchone()
    return None if row is None else {"content_hash": row[0], "snapshot": json.loads(row[1]), "source_file": row[2]}


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


PLAN_COLUMNS = ["plan_id", "model", "topology", "source", "tag_time_s", "dp_nccl_time_s", "speedup_vs_dp_nccl", "oom",
                "graph_hash", "profile_hash", "groups_hash", "topology_hash", "checkpoint_hash", "code_version", "seed",
                "budget", "warm_start_from", "calibration_hash", "plan", "created_at"]


def save_plan(conn, plan_id: str, plan: dict, source: str, topology_key: str | None = None) -> None:
    """Append a plan (the plan JSON of `tag plan`) with its lineage columns; plans are never overwritten, and
    the same plan_id again changes nothing."""
    with transaction(conn):
        _insert_plan(conn, plan_id, plan, source, topology_key)


def save_plan_with_snapshot(conn, plan_id: str, plan: dict, source: str, source_file: str | None) -> None:
    """A plan and the topology snapshot it carries (`topology_snapshot`), in one transaction: both or neither."""
    carried = plan["topology_snapshot"]
    with transaction(conn):
        _insert_snapshot(conn, plan["topology"], carried["hash"], carried["snapshot"], source_file)
        _insert_plan(conn, plan_id, plan, source, None)


def has_plan(conn, plan_id: str) -> bool:
    return conn.execute("SELECT count(*) FROM plans WHERE plan_id = ?", [plan_id]).fetchone()[0] > 0


def _insert_plan(conn, plan_id: str, plan: dict, source: str, topology_key: str | None) -> None:
    lineage = plan.get("lineage", {})
    values = [plan_id, plan["model"], topology_key or plan["topology"], source, plan["tag"]["iteration_time_s"],
              plan["baselines"]["dp_nccl"]["iteration_time_s"], plan.get("speedup_vs_dp_nccl"), plan["oom"],
              lineage.get("graph_hash"), lineage.get("profile_hash"), lineage.get("groups_hash"),
              lineage.get("topology_hash"), lineage.get("checkpoint"), lineage.get("code_version"),
              lineage.get("seed"), json.dumps(lineage.get("budget")), lineage.get("warm_start_from"),
              lineage.get("calibration"), json.dumps(plan)]
    # A step retried after its plan landed (its worker died before reporting) saves the same plan_id again.
    conn.execute(f"INSERT INTO plans ({', '.join(PLAN_COLUMNS[:-1])}) VALUES ({', '.join('?' * len(values))}) "
                 "ON CONFLICT (plan_id) DO NOTHING", values)


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


def plan_lineage(conn, model: str, topology: str) -> pd.DataFrame:
    """The history of plans for one model × topology, oldest first, with what made each."""
    return conn.execute(
        "SELECT * FROM plan_lineage WHERE model = ? AND topology = ? ORDER BY created_at, plan_id", [model, topology]
    ).df()


def current_plans(conn) -> pd.DataFrame:
    """The newest plan of every model × topology whose snapshot is not retired."""
    return conn.execute(
        f"SELECT {', '.join('p.' + c for c in PLAN_COLUMNS)} FROM plans p "
        "LEFT JOIN topology_retirements r ON r.topology = p.topology WHERE r.topology IS NULL AND p.plan_id IN ("
        "SELECT plan_id FROM (SELECT plan_id, row_number() OVER (PARTITION BY model, topology "
        "ORDER BY created_at DESC, plan_id) AS newest FROM plans) ranked WHERE newest = 1) "
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
