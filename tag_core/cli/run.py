"""`tag run DIR [--steps N] [--check]`: run an emitted graph on TF's distributed runtime."""

from __future__ import annotations

from ._common import positive_float, positive_int, print_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="run an emitted graph on local TF servers (or one task of a cluster)")
    parser.add_argument("dir", help="a folder written by `tag emit`")
    parser.add_argument("--steps", type=positive_int, default=3, help="training steps (default 3)")
    parser.add_argument("--check", action="store_true",
                        help="compare the loss and every variable with the single-device step after each step")
    parser.add_argument("--timeout", type=positive_float, default=600.0,
                        help="seconds the steps may take before the run is stopped (default 600)")
    parser.add_argument("--cluster", help="cluster.json of a real cluster: run one task of it instead of local servers")
    parser.add_argument("--task-index", type=int, default=0, help="this machine's task in --cluster (default 0)")
    parser.add_argument("--json", action="store_true", help="print the steps as JSON")
    parser.set_defaults(run=run)


def run(args) -> int:
    from tag_core.runtime.supervisor import run_emitted

    result = run_emitted(args.dir, steps=args.steps, check=args.check, timeout=args.timeout,
                         cluster=args.cluster, task_index=args.task_index,
                         echo=None if args.json else print)
    if args.json:
        print_json({"ok": result.ok, "steps": result.steps, "error": result.error,
                    "seconds_per_step": result.seconds_per_step,
                    "max_relative_difference": result.max_relative_difference})
    return 0 if result.ok else 1
