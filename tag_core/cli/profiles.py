"""`tag profiles import|export|list`: move op profiles between machines as CSV."""

from __future__ import annotations

import sys
from pathlib import Path

from ._common import open_store


def register(subparsers) -> None:
    parser = subparsers.add_parser("profiles", help="import, export or list stored op profiles")
    actions = parser.add_subparsers(dest="action", required=True)
    importer = actions.add_parser("import", help="import a CSV of op profiles (e.g. taken on real GPUs)")
    importer.add_argument("file", help="CSV with columns model, op, device_type, batch_size, run, time_us")
    importer.add_argument("--strict", action="store_true",
                          help="refuse rows whose model or op the store has not captured (default: import them "
                               "and warn with their count)")
    importer.set_defaults(run=run_import)
    exporter = actions.add_parser("export", help="write stored op profiles as CSV")
    exporter.add_argument("--model", help="only this model")
    exporter.add_argument("--device-type", help="only this device type")
    exporter.add_argument("--out", help="file to write (default: standard output)")
    exporter.set_defaults(run=run_export)
    lister = actions.add_parser("list", help="summarise stored profiles")
    lister.add_argument("--model", help="only this model")
    lister.set_defaults(run=run_list)


def run_import(args) -> int:
    from tag_core import store
    from tag_core.profile.csv_files import read_profile_csv, unknown_rows

    rows = read_profile_csv(args.file)  # read once, validated before the store opens: nothing written on bad input
    conn = open_store(args)
    try:
        warning = unknown_rows(conn, rows, args.file, strict=args.strict)  # --strict: raises before any write
        count = store.replace_profiles(conn, rows)
    finally:
        conn.close()
    if warning:
        print(f"tag: warning: {warning}", file=sys.stderr)
    print(f"imported {count} profile rows from {args.file}")
    return 0


def run_export(args) -> int:
    from tag_core.files import output_file, write_atomically
    from tag_core.profile.csv_files import export_profiles

    if args.out:  # before the store opens
        output_file(args.out, "--out")
    conn = open_store(args, read_only=True)
    try:
        text = export_profiles(conn, args.model, args.device_type)
    finally:
        conn.close()
    if args.out:
        write_atomically(Path(args.out), text, make_parents=False)
    else:
        sys.stdout.write(text)
    return 0


def run_list(args) -> int:
    from tag_core import store

    conn = open_store(args, read_only=True)
    try:
        print(store.profile_summary(conn, args.model).to_string(index=False))
    finally:
        conn.close()
    return 0
