"""`tag capture MODEL`: trace one training step into the OpGraph and store it."""

from __future__ import annotations

from ._common import add_model_timeout, open_store, positive_int32, print_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("capture", help="trace a model's training step into an OpGraph in DuckDB")
    parser.add_argument("model", help="zoo name (see `tag models`) or path/to/file.py:function")
    parser.add_argument("--batch-size", type=positive_int32, help="global batch size (default: the model's)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_model_timeout(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    from tag_core.capture.models import resolve_model
    from tag_core.capture.steps import capture_model

    spec = resolve_model(args.model, args.batch_size, args.model_timeout)
    conn = open_store(args)
    try:
        graph = capture_model(conn, spec)
    finally:
        conn.close()
    summary = graph.summary()
    if args.json:
        print_json(summary)
    else:
        for key, value in summary.items():
            print(f"{key:>16}: {value:,}" if isinstance(value, int) else f"{key:>16}: {value}")
    return 0
