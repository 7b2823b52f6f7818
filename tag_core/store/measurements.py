"""What was measured on a real runtime: calibrations (`calibrations`, `calibration_samples`) and timed
steps of emitted graphs (`measured_steps`)."""

from __future__ import annotations

import json

import pandas as pd

from .connection import transaction

CALIBRATION_COLUMNS = ["calibration_hash", "topology", "topology_hash", "source", "host", "code_version", "terms",
                       "created_at"]
SAMPLE_COLUMNS = ["kind", "link", "group_size", "bytes", "run", "seconds"]
MEASURED_STEP_COLUMNS = ["model", "topology", "strategy", "plan_id", "graph_hash", "topology_hash", "calibration_hash",
                         "batch_size", "steps", "predicted_s", "measured_s", "spread_s", "host", "measured_at"]


def save_calibration(conn, record: dict, samples: pd.DataFrame) -> None:
    """Store a calibration (`record`: CALIBRATION_COLUMNS but created_at, `terms` a dict) and its samples
    (SAMPLE_COLUMNS); the same calibration hash again replaces both."""
    columns = CALIBRATION_COLUMNS[:-1]
    samples = samples[SAMPLE_COLUMNS].copy()
    samples.insert(0, "calibration_hash", record["calibration_hash"])
    with transaction(conn):
        conn.execute("DELETE FROM calibration_samples WHERE calibration_hash = ?", [record["calibration_hash"]])
        conn.execute("DELETE FROM calibrations WHERE calibration_hash = ?", [record["calibration_hash"]])
        conn.execute(f"INSERT INTO calibrations ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                     [json.dumps(record[c]) if c == "terms" else record[c] for c in columns])
        conn.register("new_samples", samples)
        conn.execute(f"INSERT INTO calibration_samples SELECT calibration_hash, {', '.join(SAMPLE_COLUMNS)} "
                     "FROM new_samples")
        conn.unregister("new_samples")


def latest_calibration(conn, topology: str | None) -> dict | None:
    """The newest calibration recorded for `topology` (of any topology when None; CALIBRATION_COLUMNS,
    `terms` decoded), or None."""
    where, params = ("WHERE topology = ? ", [topology]) if topology is not None else ("", [])
    row = conn.execute(f"SELECT {', '.join(CALIBRATION_COLUMNS)} FROM calibrations {where}"
                       "ORDER BY created_at DESC, calibration_hash LIMIT 1", params).fetchone()
    return None if row is None else _calibration(row)


def list_calibrations(conn) -> pd.DataFrame:
    """Every calibration (CALIBRATION_COLUMNS but terms, and its number of samples), newest first."""
    columns = ", ".join(f"c.{c}" for c in CALIBRATION_COLUMNS if c != "terms")
    return conn.execute(f"SELECT {columns}, count(s.calibration_hash) AS samples FROM calibrations c "
                        "LEFT JOIN calibration_samples s ON s.calibration_hash = c.calibration_hash "
                        f"GROUP BY {columns} ORDER BY c.created_at DESC, c.calibration_hash").df()


def load_calibration(conn, calibration_hash: str) -> dict | None:
    row = conn.execute(f"SELECT {', '.join(CALIBRATION_COLUMNS)} FROM calibrations WHERE calibration_hash = ?",
                       [calibration_hash]).fetchone()
    return None if row is None else _calibration(row)


def _calibration(row) -> dict:
    record = dict(zip(CALIBRATION_COLUMNS, row))
    record["terms"] = json.loads(record["terms"])
    return record


def calibration_samples(conn, calibration_hash: str) -> pd.DataFrame:
    return conn.execute(f"SELECT {', '.join(SAMPLE_COLUMNS)} FROM calibration_samples WHERE calibration_hash = ? "
                        "ORDER BY kind, link, group_size, bytes, run", [calibration_hash]).df()


def save_measured_step(conn, row: dict) -> None:
    """Append one measured step (MEASURED_STEP_COLUMNS but measured_at)."""
    columns = MEASURED_STEP_COLUMNS[:-1]
    with transaction(conn):
        conn.execute(f"INSERT INTO measured_steps ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                     [row.get(c) for c in columns])


def load_measured_steps(conn, model: str | None = None, topology: str | None = None) -> pd.DataFrame:
    """Measured steps, newest first, optionally for one model and/or topology."""
    clauses, params = [], []
    for column, value in (("model", model), ("topology", topology)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    return conn.execute(f"SELECT {', '.join(MEASURED_STEP_COLUMNS)} FROM measured_steps {where} "
                        "ORDER BY measured_at DESC", params).df()


def predicted_and_measured(conn, topology: str, topology_hash: str,
                           calibration_hash: str | None) -> list[tuple[float, float]]:
    """(predicted_s, measured_s) of every measured step of this topology snapshot whose prediction came from this
    calibration (None: the defaults), newest first."""
    return conn.execute("SELECT predicted_s, measured_s FROM measured_steps WHERE topology = ? AND topology_hash = ? "
                        "AND calibration_hash IS NOT DISTINCT FROM ? AND measured_s > 0 AND predicted_s IS NOT NULL "
                        "AND predicted_s BETWEEN -1e308 AND 1e308 ORDER BY measured_at DESC",
                        [topology, topology_hash, calibration_hash]).fetchall()
