"""Resources of the TAG code location, one set per environment, picked by `TAG_ENV` (default `local`).

    TAG_ENV=local   your machine: `duckdb` on `$TAG_HOME/tag.duckdb` (TAG_HOME defaults to ./.tag);
                    `profiling` at its defaults (batch sizes 1, 2, 4, 8; 5 runs after 2 warm-ups)
    TAG_ENV=ci      a throwaway run, e.g. on a 2-core CI machine: `duckdb` on `$TAG_HOME/tag.duckdb`
                    with TAG_HOME required (so nothing lands in the clone); a short profile
                    (batch sizes 1, 2; 2 runs after 1 warm-up): it checks the flow, not the timings
    TAG_ENV=cluster many machines (`make cluster-up`, docs/dagster.md): the store on the PostgreSQL server
                    TAG_STORE names, artifacts under TAG_ARTIFACTS, and a run's steps on Celery workers
                    (tag_pipelines.celery_config); the profiler at its defaults

Both use the same resource types, so the assets cannot tell them apart. Any other value of
TAG_ENV fails the load with one line: `TAG_ENV: 'prod' is not an environment; use one of: local, ci, cluster`.

`profiling` holds the profiler's settings so a run's config can change them, e.g.

    resources:
      profiling:
        config: {batch_sizes: [8, 16], runs: 3}
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import duckdb as duckdb_lib
from dagster import ConfigurableResource
from dagster_duckdb import DuckDBResource
from pydantic import Field

from tag_core import store
from tag_core.errors import TagInputError

# The environment variable that picks the resources (see RESOURCES_BY_ENV), and its default.
ENV_VAR = "TAG_ENV"
DEFAULT_ENV = "local"


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
    if database is None and os.environ.get("TAG_STORE", "").strip():  # a server's URL, as `tag` commands use
        return DuckDBResource(database=os.environ["TAG_STORE"].strip())
    path = Path(database) if database is not None else store.default_database()
    return DuckDBResource(database=str(path.resolve()))


def local_resources(database: str | Path | None = None) -> dict[str, Any]:
    """This machine: the store in $TAG_HOME, the profiler at its defaults."""
    return {"duckdb": duckdb_resource(database), "profiling": ProfilingSettings()}


def ci_resources(database: str | Path | None = None) -> dict[str, Any]:
    """A throwaway run: the store in an explicit $TAG_HOME, a short profile."""
    if database is None and not os.environ.get("TAG_HOME"):
        raise TagInputError("TAG_HOME", f"not set; {ENV_VAR}=ci needs a throwaway directory for the store")
    return {"duckdb": duckdb_resource(database), "profiling": ProfilingSettings(batch_sizes=[1, 2], runs=2, warmup=1)}


def cluster_resources(database: str | Path | None = None) -> dict[str, Any]:
    """Many machines: the store on TAG_STORE's PostgreSQL server (the resource holds its URL)."""
    url = str(database) if database is not None else os.environ.get("TAG_STORE", "")
    if not url.startswith(("postgresql://", "postgres://")):
        raise TagInputError("TAG_STORE", f"{ENV_VAR}=cluster needs a postgresql:// URL (source .cluster/env), "
                            f"got {url!r}")
    return {"duckdb": DuckDBResource(database=url), "profiling": ProfilingSettings()}


RESOURCES_BY_ENV: dict[str, Callable[..., dict[str, Any]]] = {
    "local": local_resources, "ci": ci_resources, "cluster": cluster_resources}


def executor_for(env: str | None = None):
    """The executor of environment `env`: Celery in cluster mode, else Dagster's default."""
    if environment(env) != "cluster":
        return None
    from dagster_celery import celery_executor

    from .celery_config import executor_config

    return celery_executor.configured(executor_config(), name="celery")


def environment(name: str | None = None) -> str:
    """`name`, else $TAG_ENV, else `local`; a name with no resources is a one-line TagInputError."""
    name = name or os.environ.get(ENV_VAR) or DEFAULT_ENV
    if name not in RESOURCES_BY_ENV:
        raise TagInputError(ENV_VAR, f"{name!r} is not an environment; use one of: {', '.join(RESOURCES_BY_ENV)}")
    return name


def build_resources(database: str | Path | None = None, env: str | None = None) -> dict[str, Any]:
    """The resources of environment `env` (default: $TAG_ENV, else local), built now.

    The DuckDB path is fixed here: build them after TAG_HOME is set.
    """
    return RESOURCES_BY_ENV[environment(env)](database)


@contextlib.contextmanager
def open_store(resource: DuckDBResource) -> Iterator[duckdb_lib.DuckDBPyConnection]:
    """A writable connection with TAG's schema in place, for one short read or one write.

    DuckDB lets one process at a time hold the file, so this connection is the write lock: it opens
    through `tag_core.store.connect`, which waits with backoff while another process holds the file
    (up to TAG_STORE_WAIT_S, default 60 s) and then raises StoreBusy naming the holder's pid, the
    same bounded wait as every `tag` command. Callers compute before or after, never inside.
    It closes on failure too, which releases the file at once instead of at garbage collection.
    """
    try:
        conn = store.connect(resource.database)
    except store.StoreBusy as busy:  # connect names its --db option; here the file is the duckdb resource's
        raise store.StoreBusy("duckdb resource", busy.problem) from None
    try:
        yield conn
    finally:
        conn.close()


@contextlib.contextmanager
def scratch_store() -> Iterator[duckdb_lib.DuckDBPyConnection]:
    """A private in-memory store with TAG's schema: tag_core steps that write as they go (capture,
    profile) write here during their minutes of work, and the asset copies the rows into the shared
    store afterwards in one short transaction."""
    conn = duckdb_lib.connect(":memory:", config=store.CONNECT_CONFIG)
    try:
        store.ensure_schema(conn)
        yield conn
    finally:
        conn.close()
