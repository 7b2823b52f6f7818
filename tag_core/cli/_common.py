"""Argument helpers shared by subcommands (not a subcommand itself)."""

from __future__ import annotations

import argparse
import json
import sys

from tag_core.errors import TagInputError
from tag_core.limits import INT32_MAX


def _number(text: str, convert, valid, what: str):
    """`text` as a number that `valid` accepts; argparse reports "must be <what>" otherwise."""
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, lambda v: v > 0, "a positive integer")


def positive_float(text: str) -> float:
    return _number(text, float, lambda v: 0 < v < float("inf"), "a positive number")


def non_negative_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 0, "a non-negative integer")


def positive_int32(text: str) -> int:
    """A positive integer that is stored in an INTEGER column (a batch size)."""
    return _number(text, int, lambda v: 0 < v <= INT32_MAX, f"an integer in [1, {INT32_MAX}]")


def non_negative_int32(text: str) -> int:
    """A non-negative integer that is stored in an INTEGER column (a seed)."""
    return _number(text, int, lambda v: 0 <= v <= INT32_MAX, f"an integer in [0, {INT32_MAX}]")


def positive_int_list(text: str, most: int | None = None) -> list[int]:
    what = "comma-separated positive integers" + (f" of at most {most}" if most is not None else "")
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    if not values or any(v <= 0 or (most is not None and v > most) for v in values):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return sorted(set(values))


def positive_int32_list(text: str) -> list[int]:
    """Batch sizes: stored in an INTEGER column, and TF's shapes are int32."""
    return positive_int_list(text, INT32_MAX)


def open_store(args, read_only: bool = False):
    from tag_core import store

    return store.connect(getattr(args, "db", None), read_only=read_only)


def captured_with_profiles(args, spec):
    """(OpGraph, profiles) of `spec`, captured first if needed; a note when only roofline estimates exist."""
    from tag_core import store
    from tag_core.capture.steps import ensure_captured

    conn = open_store(args)
    try:
        graph = ensure_captured(conn, spec)
        profiles = store.load_profiles(conn, spec.name)
    finally:
        conn.close()
    if profiles.empty:
        print(f"tag: note: no op profiles for {spec.name}; using roofline estimates (run `tag profile {args.model}`)",
              file=sys.stderr)
    return graph, profiles


def communication(args, topology):
    """(CommModel, why it is uncalibrated or None) for `topology`: see tag_core.simulate.comm.comm_for."""
    from tag_core.simulate.comm import comm_for

    conn = open_store(args)
    try:
        return comm_for(conn, topology)
    finally:
        conn.close()


def calibration_summary(comm, uncalibrated: str | None) -> dict:
    return {"applied": True, "hash": comm.calibration_hash} if comm.calibrated else {"applied": False,
                                                                                       "why": uncalibrated}


def print_json(data) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def require(condition: bool, where: str, problem: str) -> None:
    if not condition:
        raise TagInputError(where, problem)


def check_plan(plan: dict, strategy, model: str, topology, where: str, num_ops: int | None = None) -> None:
    """The check simulate, sfb and emit make of a plan or strategy file: made for this model and topology
    (its identity fields, extra.machines) and, given the graph's `num_ops`, shaped for both. Errors name
    `where` and the field."""
    try:
        if plan.get("model") not in (None, model):
            raise TagInputError("model", f"was made for model {plan['model']!r}, not {model!r}")
        named = plan.get("topology")
        named = named.get("name") if isinstance(named, dict) else named
        if named is not None and str(named).lower() != topology.name.lower():
            raise TagInputError("topology", f"was made for topology {named!r}, not {topology.name!r}")
        batch = plan.get("batch_size")
        if batch is not None and (not isinstance(batch, int) or isinstance(batch, bool) or not 0 < batch <= INT32_MAX):
            raise TagInputError("batch_size", f"must be an integer in [1, {INT32_MAX}], got {batch!r}")
        strategy.check_machines([m.name for m in topology.machines], topology.name)
        if num_ops is not None:
            strategy.validate(num_ops, topology.num_machines, topology.num_devices)
    except TagInputError as exc:
        raise TagInputError(f"{where}: {exc.where}", exc.problem) from None


def add_model_timeout(parser, flag: str = "--timeout") -> None:
    """`flag` SECONDS into args.model_timeout: the limit on each step of loading the model (time_limit.py)."""
    from tag_core.limits import MODEL_TIMEOUT_S

    parser.add_argument(flag, dest="model_timeout", type=positive_float, metavar="SECONDS",
                        help="seconds each step of loading the model (importing its file, calling its function, "
                             f"building it, tracing a step) may take (default $TAG_MODEL_TIMEOUT, else "
                             f"{MODEL_TIMEOUT_S:g})")


def read_plan_source(args):
    """(plan, strategy, topology, check) from the arguments of `add_plan_source` (the caller has refused
    --strategy without --topology): a plan file with its topology, a strategy file, or a strategy name;
    `check(model)` makes check_plan's check of a plan or strategy file."""
    from tag_core.cluster.topology_json import load_topology
    from tag_core.emit.emitter import plan_topology, read_plan
    from tag_core.search.strategy_files import is_strategy_file, read_plan_file

    topology = load_topology(args.topology) if args.topology else None
    plan, strategy, checked, where = None, args.strategy, None, None
    if args.plan:
        plan, strategy = read_plan(args.plan)
        topology, checked, where = plan_topology(plan, topology), plan, f"--plan {args.plan}"
    elif is_strategy_file(args.strategy):
        checked, strategy = read_plan_file(args.strategy)
        where = f"--strategy {args.strategy}"

    def check(model: str) -> None:
        if where is not None:
            check_plan(checked, strategy, model, topology, where)

    return plan, strategy, topology, check


def add_plan_source(parser) -> None:
    """MODEL, then --plan or --strategy (one of them) and --topology: what `emit` and `train` work from."""
    parser.add_argument("model", help="zoo name or path/to/file.py:function")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--plan", help="plan JSON from `tag plan --out`")
    source.add_argument("--strategy", help="a baseline (dp-nccl, dp-nccl-p, horovod, single), one option for "
                                           "every op (allreduce, ps, duplicate, model_parallel), or a strategy JSON file")
    parser.add_argument("--topology", help="topology snapshot JSON (required with --strategy; with --plan, the "
                                           "snapshot the plan carries is the default)")
