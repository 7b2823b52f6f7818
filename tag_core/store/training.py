"""Runs of `tag train` (`training_runs`), and the way from a trained model back to what made it."""

from __future__ import annotations

import json

import pandas as pd

from .connection import transaction

TRAINING_COLUMNS = ["run_id", "model", "topology", "strategy", "plan_id", "graph_hash", "topology_hash",
                    "profile_hash", "calibration_hash", "data", "data_hash", "validation_hash", "batch_size",
                    "first_step", "steps", "status", "final_loss", "best_loss", "validation", "samples_per_s",
                    "input_share", "checkpoint", "model_file", "run_dir", "wall_s", "resumed_from", "loss_curve",
                    "created_at"]
_JSON = {"validation", "loss_curve"}


def save_training_run(conn, row: dict) -> None:
    """Store one run (TRAINING_COLUMNS but created_at; `validation` and `loss_curve` as Python values); the same
    run_id again replaces it."""
    columns = TRAINING_COLUMNS[:-1]
    with transaction(conn):
        conn.execute("DELETE FROM training_runs WHERE run_id = ?", [row["run_id"]])
        conn.execute(f"INSERT INTO training_runs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                     [json.dumps(row.get(c)) if c in _JSON else row.get(c) for c in columns])


def load_training_runs(conn, model: str | None = None, run_dir: str | None = None) -> pd.DataFrame:
    """Training runs, newest first, of one model and/or one run folder; JSON columns decoded."""
    clauses, params = [], []
    for column, value in (("model", model), ("run_dir", run_dir)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    frame = conn.execute(f"SELECT {', '.join(TRAINING_COLUMNS)} FROM training_runs {where} "
                         "ORDER BY created_at DESC, run_id", params).df()
    for column in _JSON:
        frame[column] = [json.loads(v) if isinstance(v, str) else v for v in frame[column]]
    return frame


def trained_lineage(conn, run_dir: str) -> list[dict]:
    """Each run of a run folder (newest first) with its plan's lineage, the snapshot's file and the calibration's
    source: the way from a trained model to everything that made it."""
    return conn.execute("""
        SELECT t.run_id, t.model, t.topology, t.strategy, t.plan_id, t.created_at, t.status, t.first_step, t.steps,
               t.final_loss, t.validation, t.data, t.data_hash, t.model_file, t.checkpoint, t.resumed_from,
               t.graph_hash, t.topology_hash, t.profile_hash, t.calibration_hash,
               p.created_at AS planned_at, p.groups_hash, p.checkpoint_hash AS gnn_checkpoint_hash, p.code_version,
               p.speedup_vs_dp_nccl, s.source_file AS snapshot_file, s.recorded_at AS snapshot_recorded_at,
               c.source AS calibration_source, c.created_at AS calibrated_at
        FROM training_runs t
        LEFT JOIN plans p ON p.plan_id = t.plan_id
        LEFT JOIN topology_snapshots s ON s.topology = t.topology AND s.content_hash = t.topology_hash
        LEFT JOIN calibrations c ON c.calibration_hash = t.calibration_hash
        WHERE t.run_dir = ? ORDER BY t.created_at DESC, t.run_id""", [run_dir]).df().to_dict("records")
