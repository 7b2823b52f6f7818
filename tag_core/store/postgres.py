"""The store on a PostgreSQL server (TAG_STORE=postgresql://…), behind the part of DuckDB's connection API
that `tag_core.store` uses: execute with `?` parameters, fetchone/fetchall/df, executemany, and register
(a DataFrame as a table for the length of a transaction).

The statements themselves are the store's, written once in SQL both databases run; the only translation
is of the schema's column types (JSON is kept as text, as DuckDB returns it) and of `?` to psycopg's `%s`.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from tag_core.errors import TagInputError

SCHEMES = ("postgresql://", "postgres://")
# Any constant: the key of the server-wide lock every store write (and schema upgrade) holds while it runs.
WRITE_LOCK = 7_246_100
_TYPES = [(re.compile(r"\bJSON\b"), "TEXT"), (re.compile(r"\bDOUBLE\b(?! PRECISION)"), "DOUBLE PRECISION")]
# The numeric type ids whose columns pandas should see as numbers (int2/4/8, float4/8, numeric, bool).
_NUMERIC_OIDS = {20, 21, 23, 700, 701, 1700}
_BOOLEAN_OID = 16


def is_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(SCHEMES)


def redacted(url: str) -> str:
    """The URL without its password, for messages."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def schema_statement(statement: str) -> str:
    """A schema statement as PostgreSQL spells its types."""
    for pattern, replacement in _TYPES:
        statement = pattern.sub(replacement, statement)
    return statement


def _placeholders(sql: str) -> str:
    # psycopg reads % as the start of a placeholder: a literal one is doubled, then each ? becomes %s.
    return sql.replace("%", "%%").replace("?", "%s")


class Result:
    """What `execute` returns: the rows of one statement."""

    def __init__(self, cursor) -> None:
        self._cursor = cursor

    def fetchone(self) -> tuple | None:
        return self._cursor.fetchone() if self._cursor.description else None

    def fetchall(self) -> list[tuple]:
        return self._cursor.fetchall() if self._cursor.description else []

    def df(self) -> pd.DataFrame:
        description = self._cursor.description or []
        names = [column.name for column in description]
        frame = pd.DataFrame(self.fetchall(), columns=names)
        for column in description:  # None in a number column reads as NaN, as DuckDB's frames do
            if column.type_code in _NUMERIC_OIDS:
                frame[column.name] = pd.to_numeric(frame[column.name], errors="coerce")
            elif column.type_code == _BOOLEAN_OID and not frame[column.name].isna().any():
                frame[column.name] = frame[column.name].astype(bool)
        return frame


class PostgresConnection:
    """One autocommit session; `tag_core.store.transaction` brackets writes with BEGIN/COMMIT."""

    backend = "postgres"

    def __init__(self, raw, url: str) -> None:
        self._raw = raw
        self.url = url
        self._registered: set[str] = set()

    def execute(self, sql: str, parameters: Sequence[Any] | None = None) -> Result:
        cursor = self._raw.cursor()
        cursor.execute(_placeholders(sql) if parameters is not None else sql,
                       [_plain(value) for value in parameters] if parameters is not None else None)
        return Result(cursor)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self._raw.cursor() as cursor:
            cursor.executemany(_placeholders(sql), [[_plain(value) for value in row] for row in rows])

    def register(self, name: str, frame: pd.DataFrame) -> None:
        """`frame` as a temporary table `name`, copied in with COPY (DuckDB scans the frame in place)."""
        self.unregister(name)
        columns = ", ".join(f'"{column}" {_column_type(frame[column])}' for column in frame.columns)
        self._raw.execute(f'CREATE TEMPORARY TABLE "{name}" ({columns})')
        self._registered.add(name)
        with self._raw.cursor() as cursor, cursor.copy(
                f'COPY "{name}" ({", ".join(chr(34) + c + chr(34) for c in frame.columns)}) FROM STDIN') as copy:
            for row in frame.itertuples(index=False, name=None):
                copy.write_row([_plain(value) for value in row])

    def unregister(self, name: str) -> None:
        if name in self._registered:
            self._raw.execute(f'DROP TABLE IF EXISTS "{name}"')
            self._registered.discard(name)

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> "PostgresConnection":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _column_type(series: pd.Series) -> str:
    if pd.api.types.is_bool_dtype(series):
        return "BOOLEAN"
    if pd.api.types.is_integer_dtype(series):
        return "BIGINT"
    if pd.api.types.is_float_dtype(series):
        return "DOUBLE PRECISION"
    if pd.api.types.is_datetime64_any_dtype(series):
        return "TIMESTAMP"
    values = series.dropna()
    if len(values) and all(isinstance(v, (bool, np.bool_)) for v in values):
        return "BOOLEAN"
    if len(values) and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        return "BIGINT"
    return "TEXT"


def _plain(value: Any) -> Any:
    """numpy scalars as Python ones, NaN and NaT as NULL: what psycopg adapts."""
    if value is None:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value != value:
        return None
    if value is pd.NaT:
        return None
    if isinstance(value, pd.Timestamp):
        return value.to_pydatetime()
    return value


def create_databases(server: str, names: list[str]) -> None:
    """Create the databases of `names` that the server at `server` (a URL without a database) lacks."""
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True, connect_timeout=10) as raw:
        present = {row[0] for row in raw.execute("SELECT datname FROM pg_database")}
        for name in names:
            if name not in present:
                raw.execute(f'CREATE DATABASE "{name}"')


def connect(url: str, read_only: bool, wait_s: float) -> PostgresConnection:
    """A session on the server, retried while it cannot be reached, up to `wait_s`; then one line."""
    import psycopg

    began = time.monotonic()
    pause, told = 0.2, False
    while True:
        try:
            raw = psycopg.connect(url, autocommit=True, connect_timeout=max(1, min(10, int(wait_s) or 1)))
            break
        except psycopg.OperationalError as exc:
            problem = _first_line(exc)
            if "FATAL" in str(exc) or time.monotonic() + pause - began > wait_s:  # refused by the server, or time up
                waited = f" after {wait_s:g} s (TAG_STORE_WAIT_S)" if "FATAL" not in str(exc) else ""
                raise TagInputError("TAG_STORE", f"cannot reach {redacted(url)}{waited}: {problem}") from None
            if not told and time.monotonic() - began >= 1.0:
                print(f"tag: waiting up to {wait_s:g} s for the store at {redacted(url)}: {problem}", file=sys.stderr)
                told = True
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
        except psycopg.ProgrammingError as exc:  # e.g. a malformed URL
            raise TagInputError("TAG_STORE", f"{redacted(url)}: {_first_line(exc)}") from None
    if read_only:
        raw.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    return PostgresConnection(raw, url)


def _first_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
