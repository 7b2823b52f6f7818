"""Writing files so that nothing is ever half-written."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from tag_core.errors import TagInputError


def write_atomically(path: str | Path, data: bytes | str, make_parents: bool = True, where: str = "--out") -> None:
    """Write to a temporary file beside `path`, then rename: a reader (or a sensor) never sees half a file.

    With `make_parents` False, a missing directory is the user's input error.
    """
    path = Path(path)
    directory = path.parent
    if make_parents:
        if path.is_dir():
            raise TagInputError(where, f"{str(path)!r} is a directory; give a file name")
        _not_special(path, where)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # e.g. a file where a directory should be
            raise TagInputError(where, f"cannot create directory {str(directory)!r} ({exc.strerror})") from None
    else:
        output_file(path, where)
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


@contextmanager
def staged_folder(folder: str | Path) -> Iterator[Path]:
    """A temporary folder beside `folder` to write into. When the block ends well, each file moves into
    `folder` (a rename each, files in subfolders first, so an index never links to a page not yet there);
    when it fails, nothing of it reaches `folder` (a report of many pages is never half-written)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        yield staging
        files = [p.relative_to(staging) for p in staging.rglob("*") if p.is_file()]
        for relative in sorted(files, key=lambda r: (-len(r.parts), str(r))):
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / relative, folder / relative)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def output_file(text: str | Path, argument: str) -> Path:
    """`text` as a file a command will write: its folder must exist (a typo must not create a tree of
    folders) and it must not be a folder. Every command checks its output paths with this (or
    `output_folder`) before any slow work; TagInputError naming `argument` otherwise."""
    path = Path(text)
    _parent_exists(path, argument)
    if path.is_dir():
        raise TagInputError(argument, f"{str(path)!r} is a directory; give a file name")
    _not_special(path, argument)
    return path


def _not_special(path: Path, argument: str) -> None:
    # The rename would replace a device, FIFO or socket (/dev/full, as root) with a plain file.
    if path.exists() and not path.is_file():
        raise TagInputError(argument,
                            f"{str(path)!r} is not a regular file (a device, FIFO or socket); give a file name")


def output_folder(text: str | Path, argument: str) -> Path:
    """`text` as a folder a command will create or fill: the folder it sits in must exist, and it must
    not be a file. TagInputError naming `argument` otherwise."""
    path = Path(text)
    _parent_exists(path, argument)
    if path.exists() and not path.is_dir():
        raise TagInputError(argument, f"{str(path)!r} is a file; give a folder")
    return path


def _parent_exists(path: Path, argument: str) -> None:
    parent = path.parent
    if not parent.is_dir():
        problem = "is not a directory" if parent.exists() else "does not exist"
        raise TagInputError(argument, f"directory {str(parent)!r} {problem}")


def input_file(text: str | Path, argument: str) -> Path:
    """`text` as a file to read; TagInputError naming `argument` when it is missing or a directory."""
    path = Path(text)
    if path.is_dir():
        raise TagInputError(argument, f"{text} is a directory, not a file")
    if not path.is_file():
        raise TagInputError(argument, f"{text} does not exist")
    return path


def reject_json_constant(token: str):
    """`parse_constant` for json.loads: Python's json takes NaN and Infinity, which are not JSON."""
    raise ValueError(f"{token} is not valid JSON")


# A lone surrogate can only come from a \\uD800-\\uDFFF escape: the text itself is strict UTF-8.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def surrogate_path(value: Any, where: str = "") -> str | None:
    """The path of the first string (value or key) holding an unpaired UTF-16 surrogate, or None.

    JSON's grammar allows "\\ud800" alone, but it is no Unicode text: printing it, or storing it in
    DuckDB, raises UnicodeEncodeError far from where it came in."""
    stack = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if _has_surrogate(item):
                return path or "document"
        elif isinstance(item, dict):
            for key in item:
                if isinstance(key, str) and _has_surrogate(key):
                    return f"{path}.{key!r}" if path else repr(key)
            stack.extend(reversed([(v, f"{path}.{k}" if path else str(k)) for k, v in item.items()]))
        elif isinstance(item, list):
            stack.extend(reversed([(v, f"{path}[{i}]") for i, v in enumerate(item) if isinstance(v, (str, dict, list))]))
    return None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


UNPAIRED_SURROGATE = "has an unpaired UTF-16 surrogate escape (\\ud800-\\udfff), which is not Unicode text"


def unpaired_surrogate(text: str, value: Any) -> str | None:
    """The path of the first string in `value`, parsed from `text`, that holds an unpaired surrogate, or
    None; the walk only runs when `text` has a surrogate escape at all."""
    return None if _SURROGATE_ESCAPE.search(text) is None else surrogate_path(value)


def read_json(path: str | Path, where: str) -> Any:
    """A user's JSON file; unreadable, not UTF-8, not JSON (NaN included), nested past Python's
    recursion limit or holding an unpaired surrogate are TagInputErrors naming `where` and the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        value = json.loads(text, parse_constant=reject_json_constant)
    except OSError as exc:
        raise TagInputError(where, f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TagInputError(where, f"{path} is not UTF-8 text") from None
    except ValueError as exc:  # JSONDecodeError is one
        raise TagInputError(where, f"{path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise TagInputError(where, f"{path} is not valid JSON: nested too deeply") from None
    field = unpaired_surrogate(text, value)
    if field is not None:
        raise TagInputError(where, f"{field}: {UNPAIRED_SURROGATE} (in {path})")
    return value
