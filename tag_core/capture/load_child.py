"""`python -m tag_core.capture.load_child REFERENCE SECONDS`: the child process of `load_check.load_in_child`.

Its own module, so that the parent side (imported by `resolve_model`) does not import `resolve_model` back.
"""

from __future__ import annotations

import sys

from tag_core.errors import TagInputError

from .models import resolve_model


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tag_core.capture.load_child REFERENCE SECONDS", file=sys.stderr)
        return 2
    try:
        resolve_model(argv[0], timeout=float(argv[1]))
    except TagInputError as exc:
        print(f"tag: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
