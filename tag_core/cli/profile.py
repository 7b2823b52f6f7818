"""`tag profile MODEL`: time every op of the training step at several batch sizes."""

from __future__ import annotations

from ._common import (
    add_model_timeout,
    non_negative_int,
    open_store,
    positive_int,
    positive_int32,
    positive_int32_list,
    print_json,
)


def register(subparsers) -> None:
    parser = subparsers.add_parser("profile", help="profile per-op times into DuckDB table op_profiles")
    parser.add_argument("model", help="zoo name or path/to/file.py:function")
    parser.add_argument("--batch-sizes", type=positive_int32_list, default=[1, 2, 4, 8], help="e.g. 1,2,4,8")
    parser.add_argument("--runs", type=positive_int, default=5, help="recorded runs per batch size (default 5)")
    parser.add_argument("--warmup", type=non_negative_int, default=2, help="unrecorded warm-up runs (default 2)")
    parser.add_argument("--batch-size", type=positive_int32, help="batch size of the captured graph")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_model_timeout(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    from tag_core import store
    from tag_core.capture.models import resolve_model
    from tag_core.profile.profiler import profile_model

    spec = resolve_model(args.model, args.batch_size, args.model_timeout)
    conn = open_store(args)
    try:
        profile_model(conn, spec, args.batch_sizes, args.runs, args.warmup)
        summary = store.profile_summary(conn, spec.name)
    finally:
        conn.close()
    summary = summary[summary.batch_size.isin(args.batch_sizes)]
    if args.json:
        print_json(summary.to_dict("records"))
    else:
        print(summary.to_string(index=False))
    return 0
