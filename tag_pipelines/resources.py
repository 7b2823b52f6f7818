"""Resources of the TAG code location, built in one place.

`duckdb` is a `DuckDBResource` on `$TAG_HOME/tag.duckdb`; `profiling` holds the
profiler's settings so a run's config can change them, e.g.

    resources:
      profiling:
        config: {batch_sizes: [8, 16], runs: 3}
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import duckdb as duckdb_lib
from dagster import ConfigurableResource
from dagster_duckdb import DuckDBResource
from pydantic import Field

from tag_core import store

# DuckDB allows one writer per file, across processes: every asset that writes
# the store runs in this pool. Give it a limit of 1 in the instance's
# dagster.yaml (`concurrency: pools: default_limit: 1`) or with
# `dagster instance concurrency set tag_duckdb 1`; a pool without a limit is unlimited.
DUCKDB_POOL = "tag_duckdb"


class ProfilingSettings(ConfigurableResource):
    """How `op_profiles` runs the profiler."""

    batch_sizes: list[int] = Field(default=[1, 2, 4, 8], description="Batch sizes to profile each op at.")
    runs: int = Field(default=5, description="Traced runs recorded per batch size.")
    warmup: int = Field(default=2, description="Untraced runs before recording; not stored.")


def duckdb_resource(database: str | Path | None = None) -> DuckDBResource:
    """A DuckDBResource on `database`, by default `$TAG_HOME/tag.duckdb` as it is now.

    The path is made absolute here so that run workers started elsewhere
    (another cwd) still write the same file.
    """
    path = Path(database) if database is not None else store.default_database()
    return DuckDBResource(database=str(path.resolve()))


def build_resources(database: str | Path | None = None) -> dict[str, Any]:
    return {"duckdb": duckdb_resource(database), "profiling": ProfilingSettings()}


@contextlib.contextmanager
def open_store(resource: DuckDBResource) -> Iterator[duckdb_lib.DuckDBPyConnection]:
    """A writable connection with TAG's schema in place.

    DuckDBResource.get_connection only closes on success; closing here on
    failure too releases the file lock at once instead of at garbage collection.
    """
    Path(resource.database).parent.mkdir(parents=True, exist_ok=True)
    with resource.get_connection() as conn:
        try:
            store.ensure_schema(conn)
            yield conn
        finally:
            conn.close()
