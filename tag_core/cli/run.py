"""`tag run DIR [--steps N] [--check | --measure [--warmup W]]`: run an emitted graph on TF's distributed runtime."""

from __future__ import annotations

import sys

from tag_core.runtime.warmup import MAX_WARMUP_STEPS, WARMUP_SECONDS, WARMUP_STEPS

from ._common import non_negative_int, positive_float, positive_int, print_json, require

STEPS = 3
MEASURED_STEPS = 20


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "run", help="run an emitted graph on local TF servers (or one task of a cluster)",
        description="Run an emitted graph. On this machine a graph whose tasks have one CPU device each (the "
                    "topology of `tag calibrate --local N`) runs as one TF server process per task, pinned to its "
                    "own core with one thread, so that its devices compute in parallel; other graphs run on "
                    "servers inside one process (--servers).")
    parser.add_argument("dir", help="a folder written by `tag emit`")
    parser.add_argument("--steps", type=positive_int,
                        help=f"training steps (default {STEPS}; with --measure, {MEASURED_STEPS} timed steps)")
    parser.add_argument("--check", action="store_true",
                        help="compare the loss and every variable with the single-device step after each step")
    parser.add_argument("--measure", action="store_true",
                        help="time --steps steps after --warmup untimed ones and store the median step time, with "
                             "its spread (the interquartile range of the timed steps), in the store's measured_steps "
                             "table beside the predicted time. The prediction is the one `tag emit` recorded in the "
                             "folder's plan.json: the simulator on the emitted strategy with the topology's stored "
                             "calibration applied (none is stored when the folder has no prediction)")
    parser.add_argument("--warmup", type=non_negative_int,
                        help=f"with --measure: untimed steps first (default: {WARMUP_STEPS} or more, until "
                             f"{WARMUP_SECONDS:g} s have passed, at most {MAX_WARMUP_STEPS}: a fresh server's first "
                             f"steps run slow)")
    parser.add_argument("--servers", choices=("auto", "pinned", "shared"), default="auto",
                        help="where local tasks serve: pinned (one single-core process per task), shared (servers "
                             "inside one process) or auto (pinned when every task has one CPU device and the machine "
                             "has a core per task); default auto")
    parser.add_argument("--timeout", type=positive_float, default=600.0,
                        help="seconds the steps may take before the run is stopped (default 600)")
    parser.add_argument("--cluster", help="cluster.json of a real cluster: run one task of it instead of local servers")
    parser.add_argument("--task-index", type=int, default=0, help="this machine's task in --cluster (default 0)")
    parser.add_argument("--json", action="store_true", help="print the steps as JSON")
    parser.set_defaults(run=run)


def run(args) -> int:
    from tag_core.runtime.supervisor import check_folder, run_emitted

    require(not (args.measure and args.check), "--check",
            "cannot be combined with --measure: the comparison restarts every variable between steps")
    require(args.warmup is None or args.measure, "--warmup", "only applies with --measure")
    require(not args.measure or args.cluster is None or args.task_index == 0, "--measure",
            "only task 0 measures: the other tasks of --cluster serve")
    if not args.measure:
        result = run_emitted(args.dir, steps=args.steps or STEPS, check=args.check, timeout=args.timeout,
                             cluster=args.cluster, task_index=args.task_index, servers=args.servers,
                             echo=None if args.json else print)
        if args.json:
            print_json(_summary(result))
        return 0 if result.ok else 1
    return _measure(args, check_folder(args.dir))


def _summary(result) -> dict:
    return {"ok": result.ok, "steps": result.steps, "error": result.error, "servers": result.servers,
            "seconds_per_step": result.seconds_per_step, "max_relative_difference": result.max_relative_difference}


def _measure(args, plan: dict) -> int:
    from tag_core.plan.measured_error import relative_error
    from tag_core.runtime.measure import measure_emitted, measured_step_row, save_measured_step

    from ._common import open_store

    open_store(args).close()  # a store that cannot be opened fails now, not after the run
    steps = args.steps or MEASURED_STEPS
    warmup, warmup_s = (WARMUP_STEPS, WARMUP_SECONDS) if args.warmup is None else (args.warmup, 0.0)
    result, timing = measure_emitted(args.dir, steps=steps, warmup=warmup, timeout=args.timeout, servers=args.servers,
                                     echo=None if args.json else print, cluster=args.cluster,
                                     task_index=args.task_index, warmup_s=warmup_s)
    if timing is None:
        if args.json:
            print_json({**_summary(result), "measurement": None})
        return 1
    row = measured_step_row(plan, timing)
    save_measured_step(row, args.db)
    predicted = row["predicted_s"]
    error = relative_error(predicted, timing.median_s) if predicted else None
    if args.json:
        print_json({**_summary(result), "measurement": {**timing.to_dict(), "predicted_s": predicted,
                                                        "relative_error": error, "row": row}})
        return 0
    print(f"measured: median {timing.median_s * 1e3:.2f} ms per step over {timing.steps} timed steps (interquartile "
          f"range {timing.spread_s * 1e3:.2f} ms, min {min(timing.seconds) * 1e3:.2f}, max "
          f"{max(timing.seconds) * 1e3:.2f}) after {len(result.steps) - timing.steps} warm-up steps, on "
          f"{result.servers} servers")
    if predicted:
        calibration = row["calibration_hash"] or "none: the cost model's defaults"
        print(f"predicted: {predicted * 1e3:.2f} ms (calibration {calibration}): error {error:+.1%}")
    else:
        why = (plan.get("prediction") or {}).get("why") or "plan.json records no prediction (emitted before `tag " \
                                                               "emit` recorded them?)"
        print(f"predicted: none, {why}", file=sys.stderr)
    print(f"stored in measured_steps: {row['model']} / {row['strategy']} on {row['topology']}")
    return 0
