"""Bad cluster-mode configuration, as a user meets it: one line naming the setting and what is wrong, exit 2,
and nothing written. Real servers where one is needed; free ports where none must answer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tag_core import store
from tag_pipelines.devserver import free_port

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    base = {key: value for key, value in os.environ.items() if not key.startswith(("TAG_", "DAGSTER_"))}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env={**base, "TF_CPP_MIN_LOG_LEVEL": "2", **env},
                          capture_output=True, text=True, timeout=timeout, check=False)


def last_line(done: subprocess.CompletedProcess) -> str:
    return done.stderr.strip().splitlines()[-1]


def test_a_store_url_of_an_unknown_scheme(tmp_path: Path) -> None:
    done = run(["-m", "tag_core.cli", "lineage", "mlp", "testbed"],
               {"TAG_HOME": str(tmp_path / "home"), "TAG_STORE": "oracle://x/y"})
    assert done.returncode == 2
    assert last_line(done).endswith("TAG_STORE: unknown store scheme 'oracle' in oracle://x/y; "
                                    "use a DuckDB file's path or a postgresql:// URL")
    assert not (tmp_path / "home").exists()


def test_an_unreachable_postgres_after_a_bounded_wait(tmp_path: Path) -> None:
    url = f"postgresql://tag@127.0.0.1:{free_port()}/tag"
    done = run(["-m", "tag_core.cli", "lineage", "mlp", "testbed"],
               {"TAG_HOME": str(tmp_path / "home"), "TAG_STORE": url, "TAG_STORE_WAIT_S": "2"})
    assert done.returncode == 2  # the message names the bounded wait it gave up after
    assert f"TAG_STORE: cannot reach {url} after 2 s (TAG_STORE_WAIT_S): " in last_line(done)


def test_a_store_of_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "newer.duckdb"
    store.connect(path).close()
    with duckdb.connect(str(path)) as conn:
        conn.execute("UPDATE schema_info SET version = ?", [store.SCHEMA_VERSION + 1])
    before = path.read_bytes()
    done = run(["-m", "tag_core.cli", "lineage", "mlp", "testbed"],
               {"TAG_HOME": str(tmp_path / "home"), "TAG_STORE": str(path)})
    assert done.returncode == 2
    assert last_line(done).endswith(f"database: schema version {store.SCHEMA_VERSION + 1} is newer than this "
                                    f"TAG's ({store.SCHEMA_VERSION}); upgrade TAG to use it")
    assert path.read_bytes() == before


@pytest.mark.slow
def test_an_unreachable_redis_stops_the_cluster_demo(tmp_path: Path, postgres_url: str) -> None:
    broker = f"redis://127.0.0.1:{free_port()}/0"
    (tmp_path / "dagster_home").mkdir()
    done = run(["-m", "tag_pipelines.demo", "--models", "mlp"],
               {"TAG_ENV": "cluster", "TAG_STORE": postgres_url, "TAG_CELERY_BROKER": broker, "TAG_STORE_WAIT_S": "2",
                "TAG_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster_home")})
    assert done.returncode == 2
    assert last_line(done).startswith(f"error: TAG_CELERY_BROKER: cannot reach {broker} after 2 s: ")
    assert list((tmp_path / "dagster_home").iterdir()) == []  # no run was made
