"""The model timeout (#23): a user's model file that hangs, at import, in its function, in building or in
tracing, ends after `--timeout` seconds with exit 2 and one line naming the file and the function, and
writes nothing. Also from a thread other than the main one, where a child process does the check."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import duckdb
import pytest

from tag_core.capture.models import resolve_model
from tag_core.capture.time_limit import ModelTimeout, model_timeout, time_limit
from tag_core.cli import main
from tag_core.errors import TagInputError
from tag_core.limits import MODEL_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 2
# Hang guards only (a test that hangs fails instead of blocking the suite); the error's text, not the clock,
# shows that the timeout ended the hang. Generous: the interpreter's start-up, TensorFlow's import when busy.
SLACK_S = 60

HANGS = {
    "at_import.py": """
        import time

        time.sleep(10**6)


        def build():
            pass
    """,
    "in_builder.py": """
        def build():
            while True:
                try:  # a model's code that catches Exception must not keep the timeout from ending it
                    while True:
                        pass
                except Exception:
                    pass
    """,
    "in_tracing.py": """
        import time

        import keras


        class Stuck(keras.layers.Layer):
            def compute_output_shape(self, shape):  # so that building the model does not call `call`
                return shape

            def call(self, x):
                time.sleep(10**6)
                return x


        def build():
            inputs = keras.Input((4,))
            return keras.Model(inputs, keras.layers.Dense(3)(Stuck()(inputs)))
    """,
}


@pytest.fixture
def hangs(tmp_path) -> Path:
    for name, text in HANGS.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def assert_nothing_written(home: Path, reference: str) -> None:
    database = home / "tag.duckdb"
    if database.exists():
        conn = duckdb.connect(str(database), read_only=True)
        try:
            tables = {row[0] for row in conn.execute("SELECT table_name FROM information_schema.tables").fetchall()}
            for table in {"models", "ops", "edges", "variables"} & tables:
                count = conn.execute(f"SELECT count(*) FROM {table} WHERE model = ?", [reference]).fetchone()[0]
                assert count == 0, table
        finally:
            conn.close()
    assert not [p for p in (home / "captures").rglob("*") if p.is_file()]


@pytest.mark.slow  # `tag` in a subprocess imports TensorFlow
def test_capture_of_a_model_file_that_hangs_at_import_ends_at_the_timeout(hangs, tag_home):
    path = hangs / "at_import.py"
    reference = f"{path}:build"
    result = subprocess.run([sys.executable, "-m", "tag_core.cli", "capture", reference, "--timeout", str(TIMEOUT)],
                            capture_output=True, text=True, timeout=TIMEOUT + 5 * SLACK_S,
                            env={**os.environ, "TAG_HOME": str(tag_home)})
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("tag: ")]
    assert lines == [f"tag: error: model: importing {path} (for its function build) did not finish within the "
                     f"model timeout of {TIMEOUT} s"]
    assert_nothing_written(tag_home, reference)


def test_capture_of_a_function_that_hangs_ends_at_the_timeout(hangs, tag_home, capsys):
    path = hangs / "in_builder.py"
    assert main(["capture", f"{path}:build", "--timeout", str(TIMEOUT)]) == 2  # it returns: the hang was cut
    assert capsys.readouterr().err == (f"tag: error: model: build() of {path} did not finish within the model "
                                       f"timeout of {TIMEOUT} s\n")
    assert_nothing_written(tag_home, f"{path}:build")


@pytest.mark.slow
def test_a_layer_that_hangs_in_tracing_ends_at_the_timeout(hangs, tag_home, capsys):
    reference = f"{hangs / 'in_tracing.py'}:build"
    pytest_timer, _ = signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's, when it runs with signals
    # The builder runs twice before tracing: once to read the model's inputs, once to build it.
    assert main(["capture", reference, "--timeout", str(TIMEOUT)]) == 2
    assert capsys.readouterr().err == (f"tag: error: model: tracing a training step of {reference} did not finish "
                                       f"within the model timeout of {TIMEOUT} s\n")
    assert_nothing_written(tag_home, reference)
    left, _ = signal.getitimer(signal.ITIMER_REAL)
    assert (left > 0) == (pytest_timer > 0) and left <= pytest_timer  # the earlier timer is kept


def test_emit_of_a_hanging_model_writes_no_folder(hangs, tmp_path, capsys):
    out = tmp_path / "emitted"
    assert main(["emit", f"{hangs / 'in_builder.py'}:build", "--strategy", "allreduce", "--topology",
                 str(ROOT / "examples" / "topologies" / "testbed.json"), "--out", str(out), "--timeout", "1"]) == 2
    assert "build() of" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow  # the child process imports TensorFlow
def test_outside_the_main_thread_a_child_process_finds_the_hang(hangs):
    reference = f"{hangs / 'in_builder.py'}:build"
    caught: list[BaseException] = []

    def load():
        try:
            resolve_model(reference, timeout=TIMEOUT)
        except BaseException as exc:
            caught.append(exc)

    worker = threading.Thread(target=load)
    worker.start()
    worker.join(TIMEOUT + 5 * SLACK_S)
    assert not worker.is_alive()
    assert [str(exc) for exc in caught] == [f"model: build() of {hangs / 'in_builder.py'} did not finish within "
                                            f"the model timeout of {TIMEOUT} s"]
    assert isinstance(caught[0], TagInputError)


def test_limits_nest_and_the_inner_one_names_what_ran():
    with pytest.raises(ModelTimeout, match=r"^model: inner did not finish within the model timeout of 0.3 s$"):
        with time_limit(0.3, "outer"):
            with time_limit(100, "inner"):
                time.sleep(30)
    with time_limit(5, "quick"):  # a body that finishes in time leaves nothing armed
        pass
    time.sleep(0.05)


def test_the_timeout_comes_from_the_argument_the_environment_or_the_default(monkeypatch):
    monkeypatch.delenv("TAG_MODEL_TIMEOUT", raising=False)
    assert model_timeout() == MODEL_TIMEOUT_S == 600
    assert model_timeout(7) == 7.0
    monkeypatch.setenv("TAG_MODEL_TIMEOUT", "30")
    assert model_timeout() == 30.0 and resolve_model("mlp").timeout == 30.0
    monkeypatch.setenv("TAG_MODEL_TIMEOUT", "soon")
    with pytest.raises(TagInputError, match="TAG_MODEL_TIMEOUT: must be a positive number of seconds"):
        model_timeout()
    with pytest.raises(TagInputError, match="timeout: must be a positive number of seconds"):
        resolve_model("mlp", timeout=0)


def test_a_bad_timeout_flag_is_an_input_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["capture", "mlp", "--timeout", "0"])
    assert exit_info.value.code == 2
    assert "argument --timeout: must be a positive number, got '0'" in capsys.readouterr().err
