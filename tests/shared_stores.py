"""Stores built once per test run (a module-scoped fixture builds one) and copied into each test's TAG_HOME.

Building a store means capturing, profiling or planning with real TF: seconds per model. A copy of its
DuckDB file costs milliseconds. The copy's captured steps stay in the shared folder, which tests only read.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def building(home: Path) -> Iterator[Path]:
    """TAG_HOME points at `home` while a shared store is built there."""
    before = os.environ.get("TAG_HOME")
    os.environ["TAG_HOME"] = str(home)
    try:
        yield home
    finally:
        if before is None:
            os.environ.pop("TAG_HOME", None)
        else:
            os.environ["TAG_HOME"] = before


def copy_store(shared: Path, tag_home: Path) -> Path:
    """The shared store's database, copied into this test's TAG_HOME (which it may then change freely)."""
    tag_home.mkdir(parents=True, exist_ok=True)
    shutil.copy2(shared / "tag.duckdb", tag_home / "tag.duckdb")
    return tag_home / "tag.duckdb"
