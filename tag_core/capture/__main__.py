"""`python -m tag_core.capture MODEL BATCH_SIZE FOLDER BATCHES`: trace a model's steps in a process of
their own (`steps.ensure_step_files` does this for big models, so that the Keras model's memory goes
back to the system before anything runs). Input errors print `tag: error: ...` and exit 2."""

import sys
from pathlib import Path

from tag_core.errors import TagInputError

from .models import resolve_model
from .steps import trace_batches


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: python -m tag_core.capture MODEL BATCH_SIZE FOLDER BATCHES", file=sys.stderr)
        return 2
    model, batch_size, folder, batches = argv
    try:
        trace_batches(resolve_model(model, int(batch_size)), [int(b) for b in batches.split(",")], Path(folder))
    except TagInputError as exc:
        print(f"tag: error: {exc}", file=sys.stderr)
        return 2
    return 0


sys.exit(main(sys.argv[1:]))
