"""`tag plans import FILE`: store a plan file, e.g. one `tag plan` kept aside while the store was busy."""

from __future__ import annotations

from ._common import open_store


def register(subparsers) -> None:
    parser = subparsers.add_parser("plans", help="store plan files (a plan kept aside while the store was busy)")
    actions = parser.add_subparsers(dest="action", required=True)
    importer = actions.add_parser("import", help="store a plan JSON written by `tag plan` with its topology snapshot")
    importer.add_argument("file", help="plan JSON (`tag plan --out`, or the recovery file `tag plan` named)")
    importer.set_defaults(run=run_import)


def run_import(args) -> int:
    from tag_core import store
    from tag_core.files import input_file, read_json
    from tag_core.plan.plan_file import check_plan_file, check_stored_fields

    path = input_file(args.file, "FILE")
    plan = check_plan_file(read_json(path, args.file), args.file)  # checked before the store opens
    check_stored_fields(plan, args.file)
    conn = open_store(args)
    try:
        if store.has_plan(conn, plan.plan_id):
            print(f"plan {plan.plan_id} ({plan.data['model']} on {plan.data['topology']}) is already stored")
            return 0
        store.save_plan_with_snapshot(conn, plan.plan_id, plan.data, source="import", source_file=None)
    finally:
        conn.close()
    print(f"stored plan {plan.plan_id}: {plan.data['model']} on {plan.data['topology']} from {args.file}")
    return 0
