"""Per-op profile rows (table `op_profiles`)."""

from __future__ import annotations

import pandas as pd

from .connection import transaction

PROFILE_COLUMNS = ["model", "op", "device_type", "batch_size", "run", "time_us", "host", "tf_version", "profiled_at"]


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
