"""`tag sfb MODEL --topology FILE [--plan plan.json]`: which gradients Sufficient Factor Broadcasting rebuilds."""

from __future__ import annotations

from ._common import (
    add_model_timeout,
    captured_with_profiles,
    check_plan,
    communication,
    positive_float,
    positive_int32,
    print_json,
)


def register(subparsers) -> None:
    parser = subparsers.add_parser("sfb", help="decide Sufficient Factor Broadcasting per gradient (a MILP each)")
    parser.add_argument("model", help="zoo name or path/to/file.py:function (captured first if needed)")
    parser.add_argument("--topology", required=True, help="topology snapshot JSON")
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--plan", metavar="PLAN_JSON", help="decide for this plan's strategy (its own SFB is ignored)")
    chosen.add_argument("--strategy", default="dp-nccl",
                        help="a baseline to decide for when there is no --plan (default dp-nccl)")
    parser.add_argument("--batch-size", type=positive_int32, help="global batch (default: the model's)")
    parser.add_argument("--time-limit", type=positive_float, default=5.0, metavar="S",
                        help="seconds per gradient's solve; past it the gradient keeps its sync (default 5)")
    parser.add_argument("--all", action="store_true", help="list every gradient considered, not only the chosen")
    parser.add_argument("--json", action="store_true", help="print the decisions as JSON")
    add_model_timeout(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    from tag_core.capture.models import resolve_model
    from tag_core.cluster.topology_json import load_topology
    from tag_core.errors import TagInputError
    from tag_core.search.baselines import BASELINES, baseline, baseline_name
    from tag_core.search.strategy_files import read_plan_file
    from tag_core.sfb.milp import apply_sfb
    from tag_core.simulate.simulator import Simulator

    topology = load_topology(args.topology)
    spec = resolve_model(args.model, timeout=args.model_timeout)
    # Both are checked before the (slow) capture: bad input writes nothing.
    plan, strategy = read_plan_file(args.plan, "--plan") if args.plan else (None, None)
    if plan is not None:
        check_plan(plan, strategy, spec.name, topology, f"--plan {args.plan}")
    else:
        try:
            baseline_name(args.strategy, "--strategy")
        except TagInputError:  # its message offers a plan file, which goes to --plan here
            raise TagInputError("--strategy", f"unknown baseline {args.strategy!r}; known: {', '.join(BASELINES)} "
                                              f"(give a plan or strategy file with --plan)") from None
    graph, profiles = captured_with_profiles(args, spec)
    sim = Simulator(graph, topology, profiles, batch_size=args.batch_size, comm=communication(args, topology)[0])
    if plan is not None:
        check_plan(plan, strategy, spec.name, topology, f"--plan {args.plan}", len(graph.ops))
    else:
        strategy = baseline(args.strategy, sim)
    result = apply_sfb(sim, strategy, args.time_limit)
    data = {"model": spec.name, "topology": topology.name, "strategy": strategy.name or args.plan,
            "batch_size": sim.batch, **result.to_dict(sim)}
    if args.json:
        data["decisions"] = [{"variable": d.variable, "gradient_op": d.gradient_op, "status": d.status,
                              "estimated_saving_s": d.saving_s, "solve_s": d.solve_s} for d in result.decisions]
        print_json(data)
        return 0
    print(f"{spec.name} on {topology.name} with {data['strategy']}, batch {sim.batch}")
    without, with_sfb = result.time_without_s, result.time_with_s
    print(f"iteration time  {without * 1e3:.2f} ms without SFB, {with_sfb * 1e3:.2f} ms with "
          f"({without / with_sfb:.2f}x)")
    counts = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in data["by_status"].items() if n)
    print(f"gradients       {data['considered']} synchronised: {counts or 'none'}; "
          f"{len(result.kept)} kept after simulating")
    print(f"solve time      median {data['solve_s_median'] * 1e3:.0f} ms, max {data['solve_s_max'] * 1e3:.0f} ms "
          f"over {data['solves']} MILPs")
    rows = [d for d in result.decisions if args.all or d.variable in result.kept]
    if rows:
        ops = graph.ops
        print(f"{'variable':<48} {'status':<10} {'saving ms':>9}  duplicated ops")
        for d in rows:
            status = "kept" if d.variable in result.kept else d.status
            types = ", ".join(ops[i].type for i in d.duplicated) or "-"
            print(f"{d.variable[:48]:<48} {status:<10} {d.saving_s * 1e3:9.3f}  {types}")
    return 0
