"""Where TAG's store lives (a DuckDB file, or a PostgreSQL server named by TAG_STORE), opening it safely,
and one transaction per write."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import duckdb

from tag_core.errors import TagInputError

from .postgres import connect as connect_server
from .postgres import WRITE_LOCK, is_url, redacted
from .migrations import refuse_newer, stored_version, upgrade
from .schema import SCHEMA_VERSION

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


def location(path: str | Path | None = None) -> tuple[str | Path, str]:
    """(where the store is, the setting that named it): `path` (--db), else TAG_STORE, else the DuckDB file in
    TAG_HOME. A server's URL stays a string; anything else is a DuckDB file's path."""
    if path is not None and str(path).strip():
        where, target = "--db", str(path).strip()
    elif os.environ.get("TAG_STORE", "").strip():
        where, target = "TAG_STORE", os.environ["TAG_STORE"].strip()
    else:
        return default_database(), "TAG_HOME"
    if is_url(target):
        return target, where
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", target)
    if scheme:
        raise TagInputError(where, f"unknown store scheme {scheme[1]!r} in {redacted(target)}; "
                                   "use a DuckDB file's path or a postgresql:// URL")
    return Path(target), where


def ensure_schema(conn) -> None:
    """Create or migrate TAG's schema to this release's version; a newer database is refused."""
    found = stored_version(conn)
    refuse_newer(found)
    if found == SCHEMA_VERSION:  # the common case: one read, no write turn taken
        return
    with transaction(conn):
        upgrade(conn)


# Never fetch or load extensions on connect: DuckDB would download sqlite_scanner to open a SQLite file.
CONNECT_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}


def connect(path: str | Path | None = None, read_only: bool = False):
    """Open (and, unless read-only, create) TAG's store: a DuckDB connection, or for a postgresql:// URL a
    `PostgresConnection` with the same calls. An unusable file or server is the user's input error."""
    target, where = location(path)
    if isinstance(target, str):
        conn = connect_server(target, read_only=False, wait_s=store_wait_s())
        with _closed_on_error(conn):
            ensure_schema(conn)  # cheap once current; a read-only session then cannot write
            if read_only:
                conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        return conn
    path = target
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
    with _closed_on_error(conn):
        if not read_only:
            ensure_schema(conn)
            return conn
        found = stored_version(conn)
        refuse_newer(found)
    if found is not None and found < SCHEMA_VERSION and os.access(path, os.W_OK):  # an older release's file
        conn.close()
        with _connect_waiting(path, False, where) as writable:
            ensure_schema(writable)
        conn = _connect_waiting(path, True, where)
    return conn


def connect_if_present(path: str | Path | None = None):
    """A read-only connection when there is a store to read, else None (a DuckDB file not made yet, or one
    another process holds): for commands that only enrich their output from it."""
    target, _ = location(path)
    if isinstance(target, Path) and not target.exists():
        return None
    try:
        return connect(path, read_only=True)
    except TagInputError:
        return None


@contextlib.contextmanager
def _closed_on_error(conn) -> Iterator:
    """A connection that a failure while setting it up closes at once (DuckDB's file lock goes with it)."""
    try:
        yield conn
    except BaseException:
        conn.close()
        raise


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
def transaction(conn) -> Iterator:
    """One write, all or nothing. Writes take turns: on PostgreSQL every session's (a transaction-scoped
    advisory lock), on DuckDB this process's threads' (one process holds the file). Each is milliseconds, and
    a replace (delete, then insert) racing another of the same key would otherwise fail, or duplicate rows
    that have no key."""
    postgres = getattr(conn, "backend", "duckdb") == "postgres"
    with contextlib.nullcontext() if postgres else _DUCKDB_WRITES:
        conn.execute("BEGIN TRANSACTION")
        if postgres:
            conn.execute("SELECT pg_advisory_xact_lock(?)", [WRITE_LOCK])
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


_DUCKDB_WRITES = threading.RLock()
