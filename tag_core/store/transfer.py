"""Copying a store's tables into another store, of either backend: a laptop's DuckDB file onto the shared
server, or the server's inputs into a file to plan against offline."""

from __future__ import annotations

import re

from .connection import transaction
from .schema import SCHEMA

TABLES = [match[1] for statement in SCHEMA
          if (match := re.match(r"\s*CREATE TABLE IF NOT EXISTS (\w+)", statement)) and match[1] != "schema_info"]


def copy_tables(source, destination, exclude: set[str] | frozenset[str] = frozenset()) -> dict[str, int]:
    """Replace each table of `destination` (but `exclude`) with `source`'s rows, in one transaction;
    rows copied per table."""
    unknown = set(exclude) - set(TABLES)
    if unknown:
        raise ValueError(f"no such tables: {sorted(unknown)}")
    copied = {}
    frames = {table: source.execute(f"SELECT * FROM {table}").df() for table in TABLES if table not in exclude}
    with transaction(destination):
        for table, frame in frames.items():
            destination.execute(f"DELETE FROM {table}")
            if frame.empty:
                copied[table] = 0
                continue
            columns = ", ".join(frame.columns)
            destination.register("copied_rows", frame)
            destination.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM copied_rows")
            destination.unregister("copied_rows")
            copied[table] = len(frame)
    return copied
