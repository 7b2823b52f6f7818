"""`python -m tag_core.capture JOB`: capture a model, or trace its steps, in a process of its own.

`steps.capture_model` and `steps.ensure_step_files` start it, so that the Keras model and optimizer state
(gigabytes for vgg19, which Keras and TF never hand back to the system) leave with this process. JOB is a
JSON file: {"model": reference, "batch_size", "timeout", "folder", "batches": [...], "graph_out": path or
null}. With `graph_out` it captures (the step at batch_size into `folder`, the OpGraph as
`graph.op_graph_to_json` to `graph_out`) and traces `batches` with the same build; without it, it traces
`batches` only. Input errors print `tag: error: ...` and exit 2.
"""

import json
import sys
from pathlib import Path

from tag_core.errors import TagInputError

from .graph import op_graph_to_json
from .models import resolve_model
from .steps import capture_here, trace_batches


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tag_core.capture JOB.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    try:
        spec = resolve_model(job["model"], job["batch_size"], job["timeout"])
        folder = Path(job["folder"])
        if job.get("graph_out"):
            result = capture_here(spec, folder, job["batches"])
            result["graph"] = op_graph_to_json(result["graph"])
            Path(job["graph_out"]).write_text(json.dumps(result))
        else:
            trace_batches(spec, job["batches"], folder)
    except TagInputError as exc:
        print(f"tag: error: {exc}", file=sys.stderr)
        return 2
    return 0


sys.exit(main(sys.argv[1:]))
