"""Bad files and paths given to the CLI: one `tag: error: <where>: ...` line, exit 2, nothing written."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from tag_core import store
from tag_core.cli import main
from tag_core.cli._tf_logs import kept_log_lines
from tag_core.errors import TagInputError
from tag_core.files import write_atomically

TAG = str(Path(sys.executable).parent / "tag")
TOPOLOGY = str(Path(__file__).parents[1] / "examples" / "topologies" / "testbed.json")
HEADER = "model,op,device_type,batch_size,run,time_us\n"
GOOD_CSV = HEADER + "mlp,Add,V100-32GB,2,0,5.0\nmlp,MatMul,V100-32GB,2,0,7.0\n"


def error_of(capsys, where: str) -> str:
    """The one stderr line, which must name `where`."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tag: error: {where}: "), err
    return err


def make_db(path: Path, tmp_path: Path) -> Path:
    csv = tmp_path / "good.csv"
    csv.write_text(GOOD_CSV)
    assert main(["--db", str(path), "profiles", "import", str(csv)]) == 0
    return path


def profile_rows(db: Path) -> list:
    with duckdb.connect(str(db), read_only=True) as conn:
        return conn.execute("SELECT * FROM op_profiles ORDER BY op").fetchall()


# ---- unusable databases (store.connect) --------------------------------------


def _sqlite(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")


@pytest.mark.parametrize("kind, make, problem", [
    ("text", lambda p: p.write_text("not a db\n"), "is not a DuckDB database"),
    ("empty", lambda p: p.write_bytes(b""), "is not a DuckDB database (an empty file)"),
    ("random", lambda p: p.write_bytes(os.urandom(4096)), "is not a DuckDB database"),
    ("sqlite", _sqlite, "is not a DuckDB database (a SQLite database)"),
    ("directory", lambda p: p.mkdir(), "is a directory"),
])
@pytest.mark.parametrize("command", [["profiles", "list"], ["profiles", "import", "CSV"]])
def test_unusable_database_is_a_db_error(tmp_path, capsys, kind, make, problem, command):
    db = tmp_path / "x.db"
    make(db)
    before = db.read_bytes() if db.is_file() else None
    csv = tmp_path / "good.csv"
    csv.write_text(GOOD_CSV)
    assert main(["--db", str(db), *[str(csv) if a == "CSV" else a for a in command]]) == 2
    assert problem in error_of(capsys, "--db")
    assert (db.read_bytes() if db.is_file() else None) == before
    assert not (tmp_path / "x.db.wal").exists()


def test_duckdb_never_fetches_extensions_on_connect(tmp_path, monkeypatch):
    """Past TAG's own check too: with the defaults DuckDB would download sqlite_scanner for a SQLite file."""
    monkeypatch.setenv("HOME", str(tmp_path))  # no extension installed here
    db = tmp_path / "x.sqlite"
    _sqlite(db)
    with pytest.raises(duckdb.Error) as caught:
        duckdb.connect(str(db), config=store.CONNECT_CONFIG)
    assert "download" not in str(caught.value).lower() and "install it first" in str(caught.value).lower()


def test_locked_database_names_the_holder(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TAG_STORE_WAIT_S", "0.5")  # opening waits this long for the holder, then names it
    db = make_db(tmp_path / "x.duckdb", tmp_path)
    capsys.readouterr()  # the import's warning: mlp is not captured in this store
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb, sys, time; c = duckdb.connect({str(db)!r}); print('ok', flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        assert main(["--db", str(db), "profiles", "list"]) == 2
        error = error_of(capsys, "--db")
        assert f"is locked by another process (pid {holder.pid}) after waiting 0.5 s (TAG_STORE_WAIT_S)" in error
    finally:
        holder.kill()
        holder.wait()
    assert len(profile_rows(db)) == 2


def test_tag_home_that_is_a_file(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.write_text("a file\n")
    monkeypatch.setenv("TAG_HOME", str(home))
    assert main(["capture", "mlp"]) == 2
    assert "cannot create directory" in error_of(capsys, "TAG_HOME")
    assert home.read_text() == "a file\n"


# ---- outputs that are directories or sit under files (files.write_atomically) --------


def test_out_that_is_a_directory(tmp_path, capsys):
    out = tmp_path / "existdir"
    out.mkdir()
    assert main(["topology", "random", "--seed", "1", "--out", str(out)]) == 2
    assert "is a directory" in error_of(capsys, "--out")
    db = make_db(tmp_path / "x.duckdb", tmp_path)
    capsys.readouterr()
    assert main(["--db", str(db), "profiles", "export", "--out", str(out)]) == 2
    assert "is a directory" in error_of(capsys, "--out")
    assert list(out.iterdir()) == []
    with pytest.raises(TagInputError, match="^--out: .* is a directory"):  # as `tag plan --out DIR` calls it
        write_atomically(out, "{}\n", make_parents=False)
    testbed = Path(__file__).resolve().parents[1] / "examples" / "topologies" / "testbed.json"
    capsys.readouterr()
    assert main(["--db", str(tmp_path / "p.duckdb"), "plan", "mlp", "--topology", str(testbed), "--out", str(out)]) == 2
    assert "is a directory" in error_of(capsys, "--out")
    assert not (tmp_path / "p.duckdb").exists()  # refused before any capture or search


def test_report_out_that_is_a_file(tmp_path, capsys):
    db = make_db(tmp_path / "x.duckdb", tmp_path)
    capsys.readouterr()
    out = tmp_path / "repfile"
    out.write_text("keep\n")
    assert main(["--db", str(db), "report", "--out", str(out)]) == 2
    assert "is a file; give a folder" in error_of(capsys, "--out")  # files.output_folder, before the store
    assert out.read_text() == "keep\n"


# ---- stdout and stderr -----------------------------------------------------------


def test_closed_pipe_exits_quietly(tmp_path):
    read, write = os.pipe()
    os.close(read)  # the reader (`head`) is gone before TAG writes
    try:
        result = subprocess.run([TAG, "models"], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                                env={**os.environ, "TAG_HOME": str(tmp_path)})
    finally:
        os.close(write)
    assert result.returncode == 1 and result.stderr == ""


@pytest.mark.slow
def test_error_after_tensorflow_loads_is_one_line(tmp_path):
    """TF's C++ start-up lines (absl's InitializeLog warning, oneDNN INFO) must not precede the error."""
    (tmp_path / "um.py").write_text(textwrap.dedent("""
        def m():
            return 3
    """))
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # the CLI's default applies
    result = subprocess.run([TAG, "capture", "um.py:m"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**env, "TAG_HOME": str(tmp_path / "home")})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("tag: error: model: "), result.stderr


def test_tf_log_filter_follows_the_level():
    text = (b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
            b"I0000 00:00:1.0  1 port.cc:153] oneDNN custom operations are on.\n"
            b"I0000 00:00:1.1  1 cpu_feature_guard.cc:227] optimized\nTo enable the following instructions: AVX2\n"
            b"W0000 00:00:1.2  1 x.cc:1] a warning\n"
            b"E0000 00:00:1.3  1 x.cc:2] an error\n")
    assert kept_log_lines(text, 0) == text  # a user's TF_CPP_MIN_LOG_LEVEL=0 shows everything
    assert kept_log_lines(text, 1) == text.split(b"\n", 1)[0] + b"\n" + b"".join(text.splitlines(True)[4:])
    assert kept_log_lines(text, 2) == b"E0000 00:00:1.3  1 x.cc:2] an error\n"
    assert kept_log_lines(b"not a log line\n", 3) == b"not a log line\n"


# ---- profile CSVs ---------------------------------------------------------------------


@pytest.mark.parametrize("rows, where, problem", [
    ("mlp,Add,V100-32GB,2,0,5,7,8,9,10", ":2", "has 10 fields; the header has 6"),  # pandas shifted it
    ("mlp,Sub,V100-32GB,2,0,5\nmlp,Add,V100-32GB,2,0", ":3", "has 5 fields; the header has 6"),
    ("mlp,Add,V100-32GB,99999999999999999999,0,5", ":2.batch_size", "must be at most 2147483647"),
    ("mlp,Add,V100-32GB,2,2147483648,5", ":2.run", "must be at most 2147483647"),
])
def test_profile_csv_rows_that_do_not_fit(tmp_path, capsys, rows, where, problem):
    db = make_db(tmp_path / "x.duckdb", tmp_path)
    before = profile_rows(db)
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + rows + "\n")
    capsys.readouterr()
    assert main(["--db", str(db), "profiles", "import", str(bad)]) == 2
    assert problem in error_of(capsys, f"{bad}{where}")
    assert profile_rows(db) == before


@pytest.mark.parametrize("args, where, problem", [
    (["--model", "nosuchmodel"], "--model", "no profiles stored for model 'nosuchmodel'"),
    (["--model", "mlp", "--device-type", "cpu"], "--device-type", "no profiles stored for device type 'cpu' of model"),
])
def test_export_matching_nothing_keeps_the_file(tmp_path, capsys, args, where, problem):
    db = make_db(tmp_path / "x.duckdb", tmp_path)
    out = tmp_path / "exist.csv"
    out.write_text("keep\n")
    capsys.readouterr()
    assert main(["--db", str(db), "profiles", "export", *args, "--out", str(out)]) == 2
    assert problem in error_of(capsys, where)
    assert out.read_text() == "keep\n"


# ---- simulate --timeline ---------------------------------------------------------------


@pytest.mark.parametrize("name, problem", [
    ("x.foo", "needs an image file extension (avif, eps, "),
    ("noextension", "it has none"),
    ("existdir", "is a directory"),
])
def test_timeline_checked_before_any_work(tag_home, tmp_path, capsys, name, problem):
    (tmp_path / "existdir").mkdir()
    assert main(["simulate", "mlp", "--topology", TOPOLOGY, "--strategy", "dp-nccl",
                 "--timeline", str(tmp_path / name)]) == 2
    assert problem in error_of(capsys, "--timeline")
    assert not tag_home.exists()  # nothing captured, no database made
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existdir"]
