"""`tag profiles import` range checks: times within one hour per op, catalog device types, and rows of a
model or op the store does not know (a warning that counts them, or refused with --strict). Every refusal
is one line naming the file, row and column, exit 2, and nothing stored. Real TF capture and DuckDB."""

from __future__ import annotations

import csv
import io

import duckdb
import pytest
from shared_stores import building, copy_store

from tag_core import store
from tag_core.capture import load_op_graph, resolve_model
from tag_core.capture.steps import ensure_captured
from tag_core.cli import main

TINY = "small_cnn[image_size=8,classes=4]"
HEADER = "model,op,device_type,batch_size,run,time_us,overhead_us\n"


def csv_text(*lines: tuple) -> str:
    """The header and `lines`, quoted as CSV (the model's name has commas in it)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(lines)
    return HEADER + out.getvalue()


@pytest.fixture(scope="module")
def captured_store(tmp_path_factory):
    """TINY captured (not profiled), once for this module; its first two op names."""
    with building(tmp_path_factory.mktemp("captured") / "tag_home") as home:
        with store.connect() as conn:
            spec = resolve_model(TINY)
            ensure_captured(conn, spec)
            ops = [op.name for op in load_op_graph(conn, spec.name).ops[:2]]
    return home, spec.name, ops


@pytest.fixture
def db(captured_store, tag_home, tmp_path):
    """This test's copy of the store, with one good import already in it."""
    home, model, ops = captured_store
    path = copy_store(home, tag_home)
    good = tmp_path / "good.csv"
    good.write_text(csv_text((model, ops[0], "T4", 2, 0, 5.5, 1.0), (model, ops[1], "T4", 2, 0, 0, "")))
    assert main(["--db", str(path), "profiles", "import", "--strict", str(good)]) == 0
    return path, model, ops


def rows(path) -> list:
    with duckdb.connect(str(path), read_only=True) as conn:
        return conn.execute("SELECT * FROM op_profiles ORDER BY ALL").fetchall()


def one_error_line(capsys, where: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tag: error: {where}: "), err
    return err


@pytest.mark.parametrize("column, value, fragment", [
    ("time_us", "1e30", "from 0 to 3.6e+09 (one hour per op), got '1e30'"),
    ("time_us", "1.7e308", "one hour per op"),
    ("time_us", "3600000001", "one hour per op"),
    ("time_us", "inf", "finite"),
    ("time_us", "-Infinity", "finite"),
    ("time_us", "NaN", "finite"),
    ("time_us", "-0.5", "from 0"),
    ("overhead_us", "1e30", "within +-3.6e+09 (one hour per op)"),
    ("overhead_us", "-4e12", "one hour per op"),
    ("overhead_us", "nan", "finite"),
    ("device_type", "TPUv9", "unknown device type 'TPUv9'; known: V100-16GB"),
    ("device_type", "V100", "unknown device type 'V100'"),
])
def test_out_of_range_or_unknown_values_are_refused(db, tmp_path, capsys, column, value, fragment):
    path, model, ops = db
    before = rows(path)
    fields = {"model": model, "op": ops[0], "device_type": "V100-32GB", "batch_size": "4", "run": "0",
              "time_us": "3.0", "overhead_us": "0.5"}
    good_line = tuple({**fields, "run": "1"}.values())
    fields[column] = value
    bad = tmp_path / "bad.csv"
    bad.write_text(csv_text(good_line, tuple(fields.values())))
    assert main(["--db", str(path), "profiles", "import", str(bad)]) == 2
    err = one_error_line(capsys, f"{bad}:3.{column}")
    assert fragment in err
    assert rows(path) == before  # the good first row was not stored either


def test_zero_time_and_any_catalog_spelling_are_taken(db, tmp_path, capsys):
    path, model, ops = db
    ok = tmp_path / "ok.csv"
    ok.write_text(csv_text((model, ops[0], "h200-141gb", 8, 0, 0, ""), (model, ops[1], "CPU", 8, 0, 3600000000, -2)))
    assert main(["--db", str(path), "profiles", "import", str(ok)]) == 0
    assert capsys.readouterr().err == ""
    stored = {(r[2], r[5]) for r in rows(path) if r[3] == 8}
    assert stored == {("H200-141GB", 0.0), ("cpu", 3.6e9)}  # stored in the catalog's spelling


def test_unknown_models_and_ops_are_counted_in_a_warning(db, tmp_path, capsys):
    path, model, ops = db
    stale = tmp_path / "stale.csv"
    stale.write_text(csv_text((model, ops[0], "T4", 16, 0, 1, ""), (model, "NoSuchOp", "T4", 16, 0, 1, ""),
                              ("resnet9000", "Add", "T4", 16, 0, 1, ""), ("resnet9000", "Mul", "T4", 16, 0, 1, "")))
    assert main(["--db", str(path), "profiles", "import", str(stale)]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("tag: warning: 2 row(s) name a model")
    assert "and 1 an op not in the model's captured graph" in captured.err
    assert f"(first: {stale}:3, op 'NoSuchOp' is not in the captured graph of '{model}')" in captured.err
    assert "imported 4 profile rows" in captured.out
    assert len([r for r in rows(path) if r[3] == 16]) == 4


@pytest.mark.parametrize("bad_model, bad_op, where, fragment", [
    ("resnet9000", "Add", "3.model", "model 'resnet9000' has not been captured (--strict"),
    (None, "NoSuchOp", "3.op", "op 'NoSuchOp' is not in the captured graph of"),
])
def test_strict_refuses_unknown_models_and_ops(db, tmp_path, capsys, bad_model, bad_op, where, fragment):
    path, model, ops = db
    before = rows(path)
    stale = tmp_path / "stale.csv"
    stale.write_text(csv_text((model, ops[0], "T4", 16, 0, 1, ""), (bad_model or model, bad_op, "T4", 16, 0, 1, "")))
    assert main(["--db", str(path), "profiles", "import", "--strict", str(stale)]) == 2
    assert fragment in one_error_line(capsys, f"{stale}:{where}")
    assert rows(path) == before
