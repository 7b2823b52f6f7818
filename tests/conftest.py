"""Shared fixtures. Tests are hermetic: TAG_HOME, DAGSTER_HOME and the model registry point at
temporary directories (one per test, and one for the session for module-scoped fixtures), and
the session fails if it left anything new in the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest
from network_namespaces import NAMESPACES

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Before any fixture runs: module- and session-scoped fixtures, and code run at import, see these too.
SESSION_HOME = Path(tempfile.mkdtemp(prefix="tag-tests-"))
os.environ["TAG_HOME"] = str(SESSION_HOME / "tag_home")
os.environ["DAGSTER_HOME"] = str(SESSION_HOME / "dagster_home")
os.environ["TAG_MODELS_FILE"] = str(SESSION_HOME / "models.yaml")
# One artifact root for the session, as workers share one: a store copied into a test's TAG_HOME still
# finds the steps it names (content-addressed, so tests never clash there).
os.environ["TAG_ARTIFACTS"] = str(SESSION_HOME / "artifacts")
(SESSION_HOME / "dagster_home").mkdir()


if not NAMESPACES:
    # The runtime refuses by default to serve on every interface. Where the kernel denies namespaces the
    # suite runs the servers anyway (with the warning), and test_loopback checks the refusal for real.
    os.environ.setdefault("TAG_NETNS", "prefer")


_CHECKOUT = pytest.StashKey[set]()  # what `git status` listed when the session started


def _untracked_and_changed() -> set[str] | None:
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return set(out.stdout.splitlines()) if out.returncode == 0 else None


def pytest_sessionstart(session):
    session.config.stash[_CHECKOUT] = _untracked_and_changed()


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(SESSION_HOME, ignore_errors=True)
    before = session.config.stash.get(_CHECKOUT, None)
    after = _untracked_and_changed()
    if before is None or after is None:
        return
    new = sorted(after - before)
    if new:
        print("\ntests wrote into the checkout (they must use tmp_path / TAG_HOME):\n  " + "\n  ".join(new))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# Modules whose one test takes minutes: they start first so that, across xdist workers, the rest runs beside them.
STARTS_FIRST = ("test_end_to_end.py",)


def pytest_collection_modifyitems(session, config, items):
    """Modules with the most slow tests first (each module stays in one piece, so its fixtures build once)."""
    order: dict[str, int] = {}
    slow: dict[str, int] = {}
    for index, item in enumerate(items):
        module = item.nodeid.split("::")[0]
        order.setdefault(module, index)
        slow[module] = slow.get(module, 0) + (item.get_closest_marker("slow") is not None)

    def rank(item) -> tuple:
        module = item.nodeid.split("::")[0]
        return not module.endswith(STARTS_FIRST), -slow[module], order[module]

    items.sort(key=rank)


@pytest.fixture(autouse=True)
def tag_home(tmp_path, tmp_path_factory, monkeypatch):
    """Every test gets its own TAG_HOME (and so its own DuckDB), Dagster home and model registry.
    The last two live outside tmp_path, which stays the test's own."""
    home = tmp_path / "tag_home"
    monkeypatch.setenv("TAG_HOME", str(home))
    elsewhere = tmp_path_factory.mktemp("env")
    (elsewhere / "dagster_home").mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(elsewhere / "dagster_home"))
    monkeypatch.setenv("TAG_MODELS_FILE", str(elsewhere / "models.yaml"))
    return home


@pytest.fixture(scope="module")
def plan_data():
    """A small plan's JSON, as `tag plan --out` writes it (two machines, four devices)."""
    import json

    from simgraphs import profiles, topology, train_graph

    from tag_core.plan import plan
    from tag_core.search import Budget

    g = train_graph(layers=2)
    topo = topology(("fast", "V100-32GB", 2, 100.0), ("slow", "T4", 2, 50.0), inter_gbps=10.0)
    data = plan(g, topo, profiles(g, "cpu"), num_groups=3, budget=Budget(iterations=5), sfb=False).to_dict()
    return json.loads(json.dumps(data))


@pytest.fixture
def user_model_file(tmp_path):
    """A user model file with several builders: a plain keras.Model, a ModelSpec, and broken ones."""
    path = tmp_path / "my_models.py"
    path.write_text(
        textwrap.dedent(
            '''
            import keras
            from tag_core.models import InputSpec, ModelSpec

            def plain():
                inputs = keras.Input((12,))
                hidden = keras.layers.Dense(8, activation="relu")(inputs)
                outputs = keras.layers.Dense(5, activation="softmax")(hidden)
                return keras.Model(inputs, outputs)

            def with_spec():
                def build():
                    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
                return ModelSpec(
                    name="ignored", build=build, inputs=[InputSpec("x", (6,))],
                    label=InputSpec("y", (), "int32", max_value=3),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), batch_size=4,
                )

            def raises():
                raise RuntimeError("no GPU budget today")

            def returns_text():
                return "not a model"

            def two_outputs():
                inputs = keras.Input((4,))
                return keras.Model(inputs, [keras.layers.Dense(2)(inputs), keras.layers.Dense(3)(inputs)])

            def exits():
                import sys
                sys.exit(0)

            not_callable = 3
            '''
        )
    )
    return path


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """A real PostgreSQL server for the session (Debian's `postgresql` package; .ci/run installs it), on
    loopback with its data in a temporary folder; its URL without a database."""
    from tag_pipelines import local_cluster
    from tag_pipelines.devserver import free_port

    try:
        local_cluster.postgres_bin("initdb")
    except Exception as exc:  # noqa: BLE001 - a machine without the server package
        pytest.skip(f"no PostgreSQL server binaries ({exc}); apt-get install postgresql")
    folder = Path(tempfile.mkdtemp(prefix="tag-postgres-"))
    base = local_cluster.start_postgres(folder, free_port())
    yield base
    local_cluster.stop_postgres(folder)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: str) -> str:
    """A new, empty database on the session's server, for one test."""
    import uuid

    from tag_core.store.postgres import create_databases

    name = f"test_{uuid.uuid4().hex[:12]}"
    create_databases(postgres_server, [name])
    return f"{postgres_server}/{name}"
