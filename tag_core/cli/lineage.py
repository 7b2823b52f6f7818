"""`tag lineage MODEL TOPOLOGY`: the history of plans for a pair, and what changed between them.
`tag lineage --trained RUN_DIR|model.keras`: the runs that trained a model, each with its plan, snapshot, profiles
and calibration."""

from __future__ import annotations

from ._common import open_store, print_json

TRACKED = [("graph_hash", "graph"), ("profile_hash", "profiles"), ("groups_hash", "groups"),
           ("topology_hash", "topology snapshot"), ("checkpoint_hash", "GNN checkpoint"), ("code_version", "code"),
           ("calibration_hash", "calibration"), ("seed", "search seed")]


def register(subparsers) -> None:
    parser = subparsers.add_parser("lineage", help="history of plans for a model and topology, and what changed")
    parser.add_argument("model", nargs="?")
    parser.add_argument("topology", nargs="?")
    parser.add_argument("--trained", metavar="RUN_DIR",
                        help="instead: a `tag train` run folder or its model.keras; prints the runs that trained it "
                             "and, for each, its plan, topology snapshot, profiles and calibration")
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

    if args.trained is not None:
        if args.model is not None:
            raise TagInputError("--trained", "takes no MODEL or TOPOLOGY")
        return _trained(args)
    if args.model is None or args.topology is None:
        raise TagInputError("model/topology", "give MODEL and TOPOLOGY, or --trained RUN_DIR")
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


def _trained(args) -> int:
    from pathlib import Path

    from tag_core import store
    from tag_core.errors import TagInputError

    path = Path(args.trained)
    run_dir = path.parent if path.suffix == ".keras" else path
    conn = open_store(args, read_only=True)
    try:
        runs = store.trained_lineage(conn, str(run_dir.resolve()))
    finally:
        conn.close()
    if not runs:
        raise TagInputError("--trained", f"no training run of {run_dir} in the store (trained with another --db?)")
    if args.json:
        print_json(runs)
        return 0
    for run in runs:
        steps = f"steps {run['first_step']}-{run['steps']}"
        print(f"{str(run['created_at'])[:19]}  run {run['run_id']}  {run['model']} on {run['topology']}  {steps}  "
              f"{run['status']}  final loss {run['final_loss']:.4g}  data {run['data']} ({run['data_hash']})")
        plan = f"plan {run['plan_id']} (planned {str(run['planned_at'])[:19]})" if run["plan_id"] else \
            f"strategy {run['strategy']} (no stored plan)"
        print(f"    {plan}; snapshot {run['topology_hash']} from {run['snapshot_file'] or '-'}; profiles "
              f"{run['profile_hash'] or '-'}; calibration {run['calibration_hash'] or 'none'}"
              + (f" ({run['calibration_source']})" if run.get("calibration_source") else ""))
        if run["resumed_from"]:
            print(f"    resumed from {run['resumed_from']}")
    return 0
