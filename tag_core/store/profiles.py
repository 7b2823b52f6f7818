"""Per-op profile rows (table `op_profiles`) and what was measured of each profiled step (`profile_steps`)."""

from __future__ import annotations

import pandas as pd

from .connection import transaction

PROFILE_COLUMNS = ["model", "op", "device_type", "batch_size", "run", "time_us", "host", "tf_version", "profiled_at",
                   "overhead_us"]
STEP_COLUMNS = ["model", "device_type", "batch_size", "run", "step_us", "kernel_us", "other_kernel_us", "nodes",
                "graph_nodes", "dispatch_us", "launch_us", "threads", "grappler", "trace_level", "host", "tf_version",
                "profiled_at"]


def replace_profiles(conn, rows: pd.DataFrame, steps: pd.DataFrame | None = None) -> int:
    """Insert profile rows (and the steps they were measured in); rows for each (model, device_type, batch_size)
    they cover replace the old ones, step records included (a CSV import leaves none behind it)."""
    rows = rows.copy()
    if "overhead_us" not in rows:
        rows["overhead_us"] = None
    rows["overhead_us"] = rows["overhead_us"].astype("float64")
    rows = rows[PROFILE_COLUMNS]
    keys = rows[["model", "device_type", "batch_size"]].drop_duplicates()
    columns = ", ".join(PROFILE_COLUMNS)
    with transaction(conn):
        conn.register("profile_keys", keys)
        for table in ("op_profiles", "profile_steps"):
            conn.execute(
                f"DELETE FROM {table} p USING profile_keys k WHERE p.model = k.model "
                "AND p.device_type = k.device_type AND p.batch_size = k.batch_size"
            )
        conn.register("new_profiles", rows)
        conn.execute(f"INSERT INTO op_profiles ({columns}) SELECT {columns} FROM new_profiles")
        if steps is not None and len(steps):
            conn.register("new_steps", steps[STEP_COLUMNS])
            step_columns = ", ".join(STEP_COLUMNS)
            conn.execute(f"INSERT INTO profile_steps ({step_columns}) SELECT {step_columns} FROM new_steps")
            conn.unregister("new_steps")
        conn.unregister("profile_keys")
        conn.unregister("new_profiles")
    return len(rows)


def _where(model: str | None, device_type: str | None) -> tuple[str, list]:
    clauses, params = [], []
    if model is not None:
        clauses.append("model = ?")
        params.append(model)
    if device_type is not None:
        clauses.append("device_type = ?")
        params.append(device_type)
    return (f"WHERE {' AND '.join(clauses)}" if clauses else ""), params


def load_profiles(conn, model: str | None = None, device_type: str | None = None) -> pd.DataFrame:
    """Profile rows, optionally for one model and one device type."""
    where, params = _where(model, device_type)
    return conn.execute(
        f"SELECT {', '.join(PROFILE_COLUMNS)} FROM op_profiles {where} "
        "ORDER BY model, device_type, batch_size, op, run",
        params,
    ).df()


def load_profile_steps(conn, model: str | None = None, device_type: str | None = None) -> pd.DataFrame:
    """The profiled steps as wholes: untraced step time, traced kernel sums, nodes run, dispatch and launch costs."""
    where, params = _where(model, device_type)
    return conn.execute(
        f"SELECT {', '.join(STEP_COLUMNS)} FROM profile_steps {where} ORDER BY model, device_type, batch_size, run",
        params,
    ).df()


def profile_summary(conn, model: str | None = None) -> pd.DataFrame:
    """Per (model, device type, batch size): ops, runs, the ops' traced time per run (`step_op_time_us`), the
    executor's overhead the profile adds to them (`overhead_us`, null where not measured) and the median
    untraced step the profiler timed (`measured_step_us`, null for imported profiles)."""
    where = "WHERE model = ?" if model else ""
    return conn.execute(
        "WITH ops AS (SELECT model, device_type, batch_size, count(DISTINCT op) AS ops, count(DISTINCT run) AS runs, "
        "sum(time_us) / count(DISTINCT run) AS step_op_time_us, sum(overhead_us) / count(DISTINCT run) AS overhead_us "
        f"FROM op_profiles {where} GROUP BY model, device_type, batch_size), "
        "steps AS (SELECT model, device_type, batch_size, "
        "percentile_cont(0.5) WITHIN GROUP (ORDER BY step_us) AS measured_step_us FROM profile_steps "
        f"{where} GROUP BY model, device_type, batch_size) "
        "SELECT ops.*, steps.measured_step_us FROM ops LEFT JOIN steps USING (model, device_type, batch_size) "
        "ORDER BY model, device_type, batch_size",
        ([model, model] if model else []),
    ).df()


def profile_set_hash(conn, model: str) -> str | None:
    row = conn.execute(
        "SELECT md5(string_agg(concat_ws('|', device_type, batch_size, op, run, time_us, overhead_us), ',' "
        "ORDER BY device_type, batch_size, op, run)) FROM op_profiles WHERE model = ?",
        [model],
    ).fetchone()
    return row[0][:16] if row and row[0] else None
