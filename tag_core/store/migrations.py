"""The schema's versions: a new database gets `SCHEMA` whole; an older one runs the migrations after its
version, in one transaction; a newer one is refused. Both backends run the same steps."""

from __future__ import annotations

from dataclasses import dataclass

from tag_core.errors import TagInputError

from .postgres import schema_statement
from .schema import SCHEMA, SCHEMA_VERSION


@dataclass(frozen=True)
class Migration:
    version: int
    statements: tuple[str, ...]
    duckdb_only: tuple[str, ...] = ()  # e.g. reading DuckDB's rowid, which PostgreSQL has no databases to need


MIGRATIONS = [
    # Variables keep their capture order in a column (DuckDB's rowid gave it; PostgreSQL has none).
    Migration(2, ("ALTER TABLE variables ADD COLUMN IF NOT EXISTS position BIGINT",),
              ("UPDATE variables SET position = rowid WHERE position IS NULL",)),
]
assert MIGRATIONS[-1].version == SCHEMA_VERSION, "a new SCHEMA_VERSION needs its migration"


def backend(conn) -> str:
    return getattr(conn, "backend", "duckdb")


def stored_version(conn) -> int | None:
    """The database's schema version, or None when it has no TAG tables yet."""
    present = conn.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_info' "
                           "AND table_schema = current_schema()").fetchone()[0]
    if not present:
        return None
    found = conn.execute("SELECT max(version) FROM schema_info").fetchone()[0]
    return None if found is None else int(found)


def refuse_newer(found: int | None) -> None:
    if found is not None and found > SCHEMA_VERSION:
        raise TagInputError("database", f"schema version {found} is newer than this TAG's ({SCHEMA_VERSION}); "
                                        "upgrade TAG to use it")


def upgrade(conn) -> None:
    """Create or migrate the schema to SCHEMA_VERSION (the caller holds a write transaction, so two workers'
    first sessions do not both create the tables)."""
    kind = backend(conn)
    found = stored_version(conn)
    refuse_newer(found)
    if found == SCHEMA_VERSION:
        return
    for statement in SCHEMA:
        conn.execute(schema_statement(statement) if kind == "postgres" else statement)
    for migration in MIGRATIONS:
        if found is not None and migration.version > found:
            for statement in migration.statements + (migration.duckdb_only if kind == "duckdb" else ()):
                conn.execute(schema_statement(statement) if kind == "postgres" else statement)
    conn.execute("DELETE FROM schema_info")
    conn.execute("INSERT INTO schema_info VALUES (?)", [SCHEMA_VERSION])
