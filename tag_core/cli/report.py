"""`tag report [--out DIR]`: an HTML report of every current plan: an index and one page per model × topology."""

from __future__ import annotations

from ._common import open_store


def register(subparsers) -> None:
    parser = subparsers.add_parser("report", help="write an HTML report of all current plans")
    parser.add_argument("--out", help="folder for index.html, speedup.png and plans/ (default: $TAG_HOME/report)")
    parser.set_defaults(run=run)


def run(args) -> int:
    from tag_core import store
    from tag_core.files import output_folder
    from tag_core.report.html import build_report, format_table, plan_table_rows

    if args.out:  # the default, under TAG_HOME, is made as needed
        output_folder(args.out, "--out")
    conn = open_store(args, read_only=True)
    try:
        path = build_report(conn, args.out or store.tag_home() / "report")
        print(format_table(plan_table_rows(store.current_plans(conn))))
    finally:
        conn.close()
    print(f"\nreport: {path.resolve()}")
    return 0
