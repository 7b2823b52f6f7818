"""The `tag` command end to end: outputs, exit codes, and nothing written on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tag_core.cli import main

TAG = str(Path(sys.executable).parent / "tag")


def run_tag(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TAG_HOME": str(home)}
    return subprocess.run([TAG, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def error_lines(stderr: str) -> list[str]:
    """stderr lines that are TAG's own (TF may log at import)."""
    return [line for line in stderr.splitlines() if line.startswith("tag: ")]


def test_models_lists_the_zoo(capsys):
    assert main(["models", "--json"]) == 0
    names = {row["model"] for row in json.loads(capsys.readouterr().out)}
    assert {"vgg19", "bert_base", "mlp", "small_cnn"} <= names


@pytest.mark.slow
def test_capture_json_fields(tag_home, capsys):
    assert main(["capture", "mlp[features=8,hidden=8]", "--batch-size", "4", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    for field in ("ops", "edges", "parameters", "parameter_bytes", "gradient_ops", "apply_ops", "flops_per_step"):
        assert summary[field] > 0, field
    assert summary["batch_size"] == 4


@pytest.mark.slow
def test_user_model_file_in_capture_and_profile(tag_home, user_model_file, capsys):
    reference = f"{user_model_file}:plain"
    assert main(["capture", reference, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] == 12 * 8 + 8 + 8 * 5 + 5
    assert main(["profile", reference, "--batch-sizes", "2,3", "--runs", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["batch_size"] for r in rows} == {2, 3} and all(r["runs"] == 2 for r in rows)
    conn = duckdb.connect(str(tag_home / "tag.duckdb"), read_only=True)
    ops = conn.execute("SELECT count(*) FROM ops WHERE model = ?", [reference]).fetchone()[0]
    per_op = conn.execute(
        "SELECT min(n), max(n), count(*) FROM (SELECT op, count(*) n FROM op_profiles WHERE model = ? GROUP BY op)",
        [reference],
    ).fetchone()
    assert per_op == (4, 4, ops)


@pytest.mark.slow
def test_profiles_export_import(tag_home, tmp_path, capsys):
    assert main(["profile", "mlp[features=4,hidden=4]", "--batch-sizes", "2", "--runs", "2"]) == 0
    out = tmp_path / "p.csv"
    assert main(["profiles", "export", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["profiles", "import", str(out)]) == 0
    assert "imported" in capsys.readouterr().out


SLOW = pytest.mark.slow  # a user model file: `tag` in a subprocess imports TF


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["capture", "not_a_model"], "model: unknown model 'not_a_model'"),
        (["capture", "nowhere/x.py:build"], "model: file 'nowhere/x.py' does not exist"),
        pytest.param(["capture", "{models}:raises"], "raised RuntimeError", marks=SLOW),
        pytest.param(["capture", "{models}:absent"], "has no function 'absent'", marks=SLOW),
        (["capture", "mlp", "--batch-size", "0"], "--batch-size: must be an integer in [1, 2147483647]"),
        (["profile", "mlp", "--batch-sizes", "2,-1"], "--batch-sizes: must be comma-separated positive integers"),
        (["profile", "mlp", "--warmup", "-1"], "--warmup: must be a non-negative integer"),
        pytest.param(["profile", "{models}:raises"], "raised RuntimeError", marks=SLOW),
        (["profiles", "import", "{missing_csv}"], "cannot read the file"),
        (["profiles", "import", "{bad_csv}"], "time_us: must be a number"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, user_model_file, args, fragment):
    home = tmp_path / "home"
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text("model,op,device_type,batch_size,run,time_us\nm,a,cpu,1,0,fast\n")
    values = {"models": str(user_model_file), "missing_csv": str(tmp_path / "none.csv"), "bad_csv": str(bad_csv)}
    args = [a.format(**values) for a in args]
    result = run_tag(*args, cwd=tmp_path, home=home)
    assert result.returncode == 2, result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert not home.exists() or not any(home.rglob("*.pb")), "nothing may be written on bad input"
    assert not (home / "tag.duckdb").exists() or _empty_store(home / "tag.duckdb")


def _empty_store(path: Path) -> bool:
    conn = duckdb.connect(str(path), read_only=True)
    return conn.execute("SELECT (SELECT count(*) FROM ops) + (SELECT count(*) FROM op_profiles)").fetchone()[0] == 0
