"""Bad user input becomes a clean Dagster failure, not a stack trace."""

from __future__ import annotations

import contextlib
from typing import Iterator

from dagster import Failure

from tag_core.errors import TagInputError


@contextlib.contextmanager
def input_errors_as_failures() -> Iterator[None]:
    """Turn a TagInputError into a Failure carrying its one-line message; retrying cannot fix it."""
    try:
        yield
    except TagInputError as exc:
        raise Failure(description=str(exc), allow_retries=False) from exc
