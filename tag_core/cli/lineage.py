"""`tag lineage MODEL TOPOLOGY`: the history of plans for a pair, and what changed between them."""

from __future__ import annotations

from ._common import open_store, print_json

TRACKED = [("graph_hash", "graph"), ("profile_hash", "profiles"), ("groups_hash", "groups"),
           ("topology_hash", "topology snapshot"), ("checkpoint_hash", "GNN checkpoint"), ("code_version", "code"),
           ("calibration_hash", "calibration"), ("seed", "search seed")]


def register(subparsers) -> None:
    parser = subparsers.add_parser("lineage", help="history of plans for a model and topology, and what changed")
    parser.add_argument("model")
    parser.add_argument("topology")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(run=run)


def changes(history: list[dict]) -> list[list[str]]:
    """For each plan, the inputs that differ from the plan before it."""
    result, previous = [], None
    for row in history:
        if previous is None:
            result.append(["first plan"])
        else:
            changed = [label for column, label in TRACKED if row.get(column) != previous.get(column)]
            result.append(changed or ["nothing (a re-plan of the same inputs)"])
        previous = row
    return result


def run(args) -> int:
    import pandas as pd

    from tag_core import store
    from tag_core.errors import TagInputError

    conn = open_store(args, read_only=True)
    try:
        history = store.plan_lineage(conn, args.model, args.topology).to_dict("records")
    finally:
        conn.close()
    if not history:
        raise TagInputError("model/topology", f"no plans for {args.model!r} on {args.topology!r}")
    for row, changed in zip(history, changes(history)):
        row["changed"] = changed
    if args.json:
        print_json(history)
        return 0
    for row in history:
        speedup = f"{row['speedup_vs_dp_nccl']:.2f}x" if pd.notna(row["speedup_vs_dp_nccl"]) else "-"
        print(f"{str(row['created_at'])[:19]}  plan {row['plan_id']}  {row['tag_time_s'] * 1e3:.2f} ms  "
              f"speedup {speedup}  snapshot {row['topology_hash']}  profiles {row['profile_hash']}  "
              f"groups {row['groups_hash']}  checkpoint {row['checkpoint_hash'] or '-'}")
        print(f"    changed: {', '.join(row['changed'])}")
    return 0
