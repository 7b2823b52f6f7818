"""Writing files so that nothing is ever half-written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import TagInputError


def write_atomically(path: str | Path, data: bytes | str, make_parents: bool = True, where: str = "--out") -> None:
    """Write to a temporary file beside `path`, then rename: a reader (or a sensor) never sees half a file.

    With `make_parents` False, a missing directory is the user's input error.
    """
    path = Path(path)
    directory = path.parent
    if make_parents:
        directory.mkdir(parents=True, exist_ok=True)
    elif not directory.is_dir():
        raise TagInputError(where, f"directory {str(directory)!r} does not exist")
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
