"""`tag plan MODEL --topology FILE`: search a deployment plan with MCTS and compare it with the baselines."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from ._common import (
    add_model_timeout,
    non_negative_int32,
    open_store,
    positive_float,
    positive_int,
    positive_int32,
    print_json,
)

if TYPE_CHECKING:
    from tag_core.gnn.prior import PriorChoice


def register(subparsers) -> None:
    parser = subparsers.add_parser("plan", help="search a deployment plan (MCTS) and compare it with the baselines")
    parser.add_argument("model", help="zoo name or path/to/file.py:function (captured and profiled first if needed)")
    parser.add_argument("--topology", required=True, help="topology snapshot JSON")
    parser.add_argument("--batch-size", type=positive_int32, help="global batch to plan for (default: the model's)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--budget-iterations", type=positive_int, help="MCTS iterations (default 300)")
    budget.add_argument("--budget-seconds", type=positive_float,
                        help="wall-clock seconds for all of planning: set-up, MCTS, MCMC and SFB (capture and "
                             "profiling, when needed, come first and are not counted)")
    parser.add_argument("--seed", type=non_negative_int32, default=0, help="search seed (default 0)")
    parser.add_argument("--groups", type=positive_int, default=60, help="METIS op groups (default 60)")
    parser.add_argument("--warm-start", metavar="PLAN_JSON", help="start the search from a previous plan file")
    parser.add_argument("--prior", choices=("gnn", "uniform"),
                        help="MCTS priors: the GNN (default when a checkpoint is present) or uniform")
    parser.add_argument("--checkpoint", metavar="CKPT", help="GNN checkpoint for --prior gnn (default: "
                                                             "$TAG_GNN_CHECKPOINT, else data/checkpoints/default.pt)")
    parser.add_argument("--fusion", action="store_true",
                        help="cost fused kernels of memory-intensive ops (the stored fusion plan, else a fresh one)")
    parser.add_argument("--no-sfb", action="store_true",
                        help="skip Sufficient Factor Broadcasting (by default a MILP per gradient after the search)")
    parser.add_argument("--sfb-time-limit", type=positive_float, default=5.0, metavar="S",
                        help="seconds per gradient's SFB solve; a solve past it keeps the gradient's sync (default 5)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--out", metavar="PLAN_JSON", help="write the plan JSON to this file (atomically)")
    add_model_timeout(parser)
    parser.set_defaults(run=run)


def _fusion_plan(conn, spec, graph):
    """The stored fusion plan for this graph (the `fusion_plan` asset's), else a fresh untuned one."""
    from tag_core import store
    from tag_core.capture.steps import load_step
    from tag_core.fusion.patterns import FusionPlan, plan_fusion

    stored = store.load_fusion_plan(conn, spec.name, graph.content_hash())
    if stored is not None:
        return FusionPlan.from_json(stored)
    return plan_fusion(graph, load_step(store.captured_model(conn, spec.name)["step_file"]).graph_def)


def run(args) -> int:
    from tag_core import store
    from tag_core.capture.models import resolve_model
    from tag_core.capture.steps import ensure_captured
    from tag_core.cluster.topology_json import load_topology
    from tag_core.errors import TagInputError
    from tag_core.files import output_file, write_atomically
    from tag_core.gnn.prior import choose_prior
    from tag_core.plan.measured_error import measured_error
    from tag_core.plan.planner import DEFAULT_ITERATIONS, plan, profile_batch_sizes
    from tag_core.plan.warm_start import warm_start_problem
    from tag_core.profile.profiler import profile_model
    from tag_core.search.mcts import Budget
    from tag_core.simulate.comm import comm_for

    topology = load_topology(args.topology)
    if args.out:
        output_file(args.out, "--out")  # found before the search
    warm = _read_plan(args.warm_start) if args.warm_start else None
    if args.checkpoint and Path(args.checkpoint).is_dir():
        raise TagInputError("--checkpoint", f"{args.checkpoint} is a directory, not a checkpoint file")
    prior = _prior_without_the_gnn(args, topology.num_machines)  # its refusals come before anything slow
    spec = resolve_model(args.model, timeout=args.model_timeout)
    batch = args.batch_size or spec.batch_size
    conn = open_store(args)
    try:
        graph = ensure_captured(conn, spec)
        profiles = store.load_profiles(conn, spec.name)
        if profiles.empty:
            sizes = profile_batch_sizes(batch, topology)
            print(f"tag: no op profiles for {spec.name}; profiling at batch sizes {sizes}", file=sys.stderr)
            profile_model(conn, spec, sizes, runs=3, warmup=1, show_progress=True)
            profiles = store.load_profiles(conn, spec.name)
        profile_hash = store.profile_set_hash(conn, spec.name)
        fusion = _fusion_plan(conn, spec, graph) if args.fusion else None
        comm, uncalibrated = comm_for(conn, topology)
        error = measured_error(conn, topology, comm.calibration_hash)
    finally:
        conn.close()
    if prior is None:  # after capture and profiling (a model failing them never imports torch and dgl), store closed
        prior = _warned(choose_prior(args.prior, args.checkpoint))
    why = warm_start_problem(warm, graph, topology) if warm is not None else None
    if why:  # searching without it is still useful; the lineage must not claim it
        print(f"tag: note: --warm-start {args.warm_start}: {why}; searching without it", file=sys.stderr)
        warm = None
    budget = (Budget(seconds=args.budget_seconds) if args.budget_seconds
              else Budget(iterations=args.budget_iterations or DEFAULT_ITERATIONS))
    result = plan(graph, topology, profiles, batch_size=batch, num_groups=args.groups, budget=budget,
                  seed=args.seed, warm_start=warm, profile_hash=profile_hash, show_progress=True, prior=prior.prior,
                  lineage={"warm_start_from": args.warm_start if warm is not None else None, **prior.lineage()},
                  fusion=fusion, sfb=not args.no_sfb, sfb_time_limit_s=args.sfb_time_limit, comm=comm,
                  uncalibrated_because=uncalibrated, measured_error=error)
    data = result.to_dict()
    kept_in = _save(args, data)
    if args.out and not kept_in:  # after the store: a failed insert leaves the old file
        write_atomically(args.out, json.dumps(data, indent=2) + "\n", make_parents=False)
    if args.json:
        print_json(data)
    else:
        print(format_table(data, result.actions))
        if args.out:
            print(f"plan written to {args.out}")
    if kept_in:
        print(f"tag: error: {kept_in[1]}; the plan is kept in {kept_in[0]}: store it with "
              f"`tag plans import {kept_in[0]}`", file=sys.stderr)
        return 1
    return 0


def _prior_without_the_gnn(args, num_machines: int) -> PriorChoice | None:
    """The PriorChoice when it is settled without loading the GNN (torch and dgl take seconds to import):
    uniform priors asked for, or a problem whose joint graph is too large for the GNN (refused when the GNN
    was asked for by name, else uniform priors with a warning). None: the GNN may be used; load it later."""
    from tag_core.gnn.prior import choose_prior, sized_prior

    if args.prior == "uniform":
        return choose_prior("uniform", args.checkpoint)  # refuses a --checkpoint with it
    chosen = sized_prior(lambda: None, args.prior, num_machines, args.groups)
    return _warned(chosen) if chosen is not None else None


def _warned(prior: PriorChoice) -> PriorChoice:
    if prior.warning:
        print(f"tag: warning: {prior.warning}", file=sys.stderr)
    return prior


def _save(args, data: dict) -> tuple[Path, str] | None:
    """Store the plan with its topology snapshot. If another process holds the store past the wait
    (TAG_STORE_WAIT_S), the finished search is not lost: the plan goes to --out, else to a recovery file
    under TAG_HOME. Returns (that file, why), or None once stored."""
    from tag_core import store
    from tag_core.files import write_atomically
    from tag_core.plan.plan_file import plan_id

    try:
        conn = open_store(args)
    except store.StoreBusy as busy:
        path = Path(args.out) if args.out else _recovery_file(data)
        write_atomically(path, json.dumps(data, indent=2) + "\n", make_parents=not args.out)
        return path, str(busy)
    try:
        store.save_plan_with_snapshot(conn, plan_id(data), data, source="cli", source_file=args.topology)
    finally:
        conn.close()
    return None


def _recovery_file(data: dict) -> Path:
    from tag_core.plan.plan_file import plan_id
    from tag_core.store import tag_home

    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{data['model']}-{data['topology']}")[:100]
    return tag_home() / "recovery" / f"plan-{name}-{plan_id(data)}.json"


def _read_plan(path: str) -> dict:
    """The warm-start plan, its strategy checked before anything slow runs."""
    from tag_core.errors import TagInputError
    from tag_core.files import input_file, read_json
    from tag_core.simulate.strategy import Strategy

    source = input_file(path, "--warm-start")
    data = read_json(source, "--warm-start")
    try:
        Strategy.from_dict(data)
    except TagInputError as exc:
        raise TagInputError(f"--warm-start {path}: {exc.where}", exc.problem) from None
    return data


def format_table(data: dict, actions: list[str]) -> str:
    from tag_core.plan.comparison import comparison_rows

    search = data["search"]
    lines = [f"{data['model']} on {data['topology']}, batch {data['batch_size']}, {data['groups']} op groups",
             f"{'plan':<20} {'iteration ms':>13} {'TAG speedup':>12}"]
    for label, t, oom, speedup in comparison_rows(data):
        lines.append(f"{label:<20} {t * 1e3:13.2f} {speedup:11.2f}x" + ("  OUT OF MEMORY" if oom else ""))
    if data.get("one_device"):
        lines.append(f"plan: single, {data['one_device']['why']}")
    sfb = data.get("sfb")
    if sfb:
        lines.append(f"SFB: {len(sfb['gradients'])} of {sfb['considered']} synchronised gradients rebuilt from "
                     f"factors ({sfb['iteration_time_s_without_sfb'] * 1e3:.2f} ms without)")
    first = search["first_better_than_dp_iteration"]
    lines.append(f"search: {search['iterations']} iterations, {search['simulations']} simulations, "
                 f"{search['wall_s']:.1f} s; better than DP-NCCL from iteration {first if first else 'never'}")
    calibration = data.get("calibration") or {}
    if calibration.get("applied"):
        lines.append(f"calibration: {calibration['hash']} (with the cost model's defaults instead: "
                     f"{calibration['uncalibrated_time_s'] * 1e3:.2f} ms)")
    elif calibration:
        lines.append(f"calibration: none, {calibration['why']}")
    lineage = data.get("lineage", {})
    if lineage.get("prior"):
        lines.append(f"priors: {lineage['prior']}" + (f" (checkpoint {lineage['checkpoint']})" if lineage.get("checkpoint") else ""))
    counts = Counter(actions)
    lines.append("groups: " + ", ".join(f"{n} x {a}" for a, n in counts.most_common()))
    computing, devices = data["tag"].get("computing_devices"), len(data["tag"]["peak_memory_bytes"])
    batch = data["batch_size"]
    if computing is not None and computing < devices:
        lines.append(f"devices: {computing} of {devices} compute" + (
            f" (a batch of {batch} gives whole rows to at most {batch} replicas; --batch-size sets it)"
            if batch < devices else ""))
    return "\n".join(lines)
