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
    if path.is_dir():
        raise TagInputError(where, f"{str(path)!r} is a directory; give a file name")
    if make_parents:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # e.g. a file where a directory should be
            raise TagInputError(where, f"cannot create directory {str(directory)!r} ({exc.strerror})") from None
    elif not directory.is_dir():
        raise TagInputError(where, f"directory {str(directory)!r} does not exist")
    try:
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise TagInputError(where, f"cannot write in {str(directory)!r} ({exc.strerror})") from None
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
