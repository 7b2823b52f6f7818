"""Where TAG's database lives, opening it safely, and one transaction per write."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from pathlib import Path
from typing import Iterator

import duckdb

from tag_core.errors import TagInputError

from .schema import SCHEMA, SCHEMA_VERSION

# How long opening the store waits while another process holds it (TAG_STORE_WAIT_S): long enough for
# another plan's save or a report, short enough that a forgotten notebook gets named rather than waited out.
DEFAULT_WAIT_S = 60.0


class StoreBusy(TagInputError):
    """Another process held the store for longer than the wait."""


def store_wait_s() -> float:
    text = os.environ.get("TAG_STORE_WAIT_S", "")
    try:
        value = float(text) if text.strip() else DEFAULT_WAIT_S
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise TagInputError("TAG_STORE_WAIT_S", f"must be a number of seconds >= 0, got {text!r}")
    return value


def tag_home() -> Path:
    return Path(os.environ.get("TAG_HOME", ".tag"))


def default_database() -> Path:
    return tag_home() / "tag.duckdb"


def ensure_schema(conn: duckdb.DuckDBPyConnection) -> None:
    with transaction(conn):
        for statement in SCHEMA:
            conn.execute(statement)
        row = conn.execute("SELECT max(version) FROM schema_info").fetchone()
        if row[0] is None:
            conn.execute("INSERT INTO schema_info VALUES (?)", [SCHEMA_VERSION])
        elif row[0] > SCHEMA_VERSION:
            raise TagInputError("database", f"schema version {row[0]} is newer than this TAG ({SCHEMA_VERSION})")


# Never fetch or load extensions on connect: DuckDB would download sqlite_scanner to open a SQLite file.
CONNECT_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}


def connect(path: str | Path | None = None, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (and, unless read-only, create) TAG's database; an unusable file is the user's input error."""
    where = "--db" if path else "TAG_HOME"
    path = Path(path) if path else default_database()
    if path.is_dir():
        raise TagInputError(where, f"{path} is a directory, not a DuckDB database")
    if path.exists():
        _require_duckdb_file(path, where)
    elif read_only:
        raise TagInputError("database", f"{path} does not exist yet; capture or profile a model first")
    else:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # e.g. TAG_HOME is a file
            raise TagInputError(where, f"cannot create directory {str(path.parent)!r} ({exc.strerror})") from None
    conn = _connect_waiting(path, read_only, where)
    if not read_only:
        ensure_schema(conn)
    return conn


def _connect_waiting(path: Path, read_only: bool, where: str) -> duckdb.DuckDBPyConnection:
    """duckdb.connect, retried with backoff while another process holds the file, up to `store_wait_s()`."""
    wait_s = store_wait_s()
    began = time.monotonic()
    give_up = began + wait_s
    pause, told = 0.05, False
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only, config=CONNECT_CONFIG)
        except duckdb.Error as exc:
            problem = _open_problem(path, exc)
            if "locked by another process" not in problem:
                raise TagInputError(where, problem) from None
            if time.monotonic() + pause > give_up:
                waited = f" after waiting {wait_s:g} s (TAG_STORE_WAIT_S)" if wait_s else ""
                raise StoreBusy(where, problem.replace("; close it", f"{waited}; close it")) from None
            if not told and time.monotonic() - began >= 1.0:  # a short wait passes unremarked
                print(f"tag: waiting up to {wait_s:g} s for the store: {problem.split('; ')[0]}", file=sys.stderr)
                told = True
            time.sleep(pause)
            pause = min(pause * 2, 1.0)


def _require_duckdb_file(path: Path, where: str) -> None:
    """DuckDB files carry b"DUCK" at byte 8. Checking first keeps DuckDB from opening anything else (an installed
    sqlite extension would open a SQLite file, and TAG's tables would be written into it)."""
    try:
        with path.open("rb") as file:
            head = file.read(16)
    except OSError as exc:
        raise TagInputError(where, f"cannot read {path} ({exc.strerror})") from None
    if head[8:12] != b"DUCK":
        kind = "an empty file" if not head else "a SQLite database" if head.startswith(b"SQLite format 3") else None
        raise TagInputError(where, f"{path} is not a DuckDB database" + (f" ({kind})" if kind else ""))


def _open_problem(path: Path, exc: duckdb.Error) -> str:
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "Could not set lock" in message:
        pid = re.search(r"\(PID (\d+)\)", message)
        return f"{path} is locked by another process{f' (pid {pid[1]})' if pid else ''}; close it and try again"
    return f"{path}: {message.removeprefix('IO Error: ')}"


@contextlib.contextmanager
def transaction(conn: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    conn.execute("BEGIN TRANSACTION")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
