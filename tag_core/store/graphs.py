"""Captured op graphs (tables `models`, `ops`, `edges`, `variables`) and their op groups.

Rows in, rows out: `tag_core.capture` turns them into an OpGraph, so the store knows no stage's types.
"""

from __future__ import annotations

import json

import pandas as pd

from tag_core.errors import TagInputError

from .connection import transaction

MODEL_COLUMNS = ["model", "batch_size", "source_hash", "graph_hash", "graph_file", "step_file", "summary", "captured_at"]
OP_COLUMNS = ["name", "type", "output_bytes", "flops", "parameter_bytes", "is_parameter", "is_gradient", "is_apply",
              "is_input", "batch_scaled", "variable", "other_variables"]
EDGE_COLUMNS = ["src", "dst", "bytes", "batch", "tensor"]
VARIABLE_COLUMNS = ["name", "shape", "dtype", "bytes", "trainable", "owner", "gradient_op"]


def save_op_graph(conn, model: dict, ops: list[dict], edges: list[dict], variables: list[dict]) -> None:
    """Replace a model's graph: `model` holds the `models` row (MODEL_COLUMNS but captured_at), the lists
    hold one dict per op (OP_COLUMNS, in index order), edge and variable."""
    name = model["model"]
    ops = pd.DataFrame(ops, columns=OP_COLUMNS)
    ops["other_variables"] = ops["other_variables"].map(lambda names: json.dumps(list(names)))
    ops.insert(0, "idx", range(len(ops)))
    ops.insert(0, "model", name)
    edges = pd.DataFrame(edges, columns=EDGE_COLUMNS)
    edges.insert(0, "model", name)
    variables = pd.DataFrame(variables, columns=VARIABLE_COLUMNS)
    variables["shape"] = variables["shape"].map(lambda s: json.dumps(list(s)))
    variables.insert(0, "model", name)
    variables["position"] = range(len(variables))
    with transaction(conn):
        for table in ("ops", "edges", "variables", "models"):
            conn.execute(f"DELETE FROM {table} WHERE model = ?", [name])
        conn.register("new_ops", ops)
        conn.execute(f"INSERT INTO ops SELECT model, idx, {', '.join(OP_COLUMNS)} FROM new_ops")
        conn.register("new_edges", edges)
        conn.execute(f"INSERT INTO edges SELECT model, {', '.join(EDGE_COLUMNS)} FROM new_edges")
        conn.register("new_variables", variables)
        conn.execute(f"INSERT INTO variables (model, {', '.join(VARIABLE_COLUMNS)}, position) "
                     f"SELECT model, {', '.join(VARIABLE_COLUMNS)}, position FROM new_variables")
        columns = MODEL_COLUMNS[:-1]
        conn.execute(f"INSERT INTO models ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                     [json.dumps(model[c]) if c == "summary" else model[c] for c in columns])
        for table in ("new_ops", "new_edges", "new_variables"):
            conn.unregister(table)


def captured_model(conn, model: str) -> dict | None:
    row = conn.execute(f"SELECT {', '.join(MODEL_COLUMNS)} FROM models WHERE model = ?", [model]).fetchone()
    if row is None:
        return None
    record = dict(zip(MODEL_COLUMNS, row))
    record["summary"] = json.loads(record["summary"]) if record["summary"] else {}
    return record


def op_graph_rows(conn, model: str) -> tuple[dict, list[tuple], list[tuple], list[tuple]]:
    """(models row, op rows, edge rows, variable rows) of a captured model, in OP/EDGE/VARIABLE_COLUMNS
    order; `other_variables` and `shape` decoded from JSON."""
    record = captured_model(conn, model)
    if record is None:
        raise TagInputError("model", f"{model!r} has not been captured; run `tag capture {model}` first")
    # A read-only connection to an older release's file it may not upgrade lacks the newer columns.
    op_columns = ", ".join(OP_COLUMNS[:-1] + ["other_variables" if _has_column(conn, "ops", "other_variables")
                                              else "NULL"])
    order = "position" if _has_column(conn, "variables", "position") else "rowid"
    op_rows = conn.execute(f"SELECT {op_columns} FROM ops WHERE model = ? ORDER BY idx", [model]).fetchall()
    edge_rows = conn.execute(
        f"SELECT {', '.join(EDGE_COLUMNS)} FROM edges WHERE model = ? ORDER BY src, dst, tensor", [model]
    ).fetchall()
    variable_rows = conn.execute(
        f"SELECT {', '.join(VARIABLE_COLUMNS)} FROM variables WHERE model = ? ORDER BY {order}", [model]
    ).fetchall()
    ops = [(*row[:-1], tuple(json.loads(row[-1])) if row[-1] else ()) for row in op_rows]
    variables = [(row[0], tuple(json.loads(row[1])), *row[2:]) for row in variable_rows]
    return record, ops, edge_rows, variables


def _has_column(conn, table: str, column: str) -> bool:
    return conn.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = ? AND column_name = ? "
                        "AND table_schema = current_schema()", [table, column]).fetchone()[0] > 0


def list_captured_models(conn) -> list[str]:
    return [row[0] for row in conn.execute("SELECT model FROM models ORDER BY model").fetchall()]


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
