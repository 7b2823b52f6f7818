"""`tag simulate MODEL --topology FILE --strategy NAME|plan.json`: score one strategy with the simulator."""

from __future__ import annotations

from pathlib import Path

from ._common import (
    add_model_timeout,
    calibration_summary,
    captured_with_profiles,
    check_plan,
    communication,
    positive_int32,
    print_json,
)


def register(subparsers) -> None:
    parser = subparsers.add_parser("simulate", help="simulate one training iteration of a strategy on a topology")
    parser.add_argument("model", help="zoo name or path/to/file.py:function (captured first if needed)")
    parser.add_argument("--topology", required=True, help="topology snapshot JSON")
    parser.add_argument("--strategy", required=True,
                        help="a baseline (dp-nccl, dp-nccl-p, horovod, single), one option for every op "
                             "(allreduce, ps, duplicate, model_parallel), or a strategy/plan .json file")
    parser.add_argument("--batch-size", type=positive_int32,
                        help="global batch to simulate (default: the plan's, else the model's)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--timeline", metavar="FILE",
                        help="write a Gantt chart of the iteration to this file (.png, .svg, .pdf, ...)")
    add_model_timeout(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    from tag_core.capture.models import resolve_model
    from tag_core.cluster.topology_json import load_topology
    from tag_core.files import output_file
    from tag_core.search.strategy_files import check_strategy_name, is_strategy_file, load_strategy, read_plan_file
    from tag_core.simulate.simulator import Simulator
    from tag_core.simulate.timeline import check_timeline_path

    if args.timeline:  # before the slow steps
        output_file(args.timeline, "--timeline")
        check_timeline_path(args.timeline)
    topology = load_topology(args.topology)
    spec = resolve_model(args.model, timeout=args.model_timeout)
    # A file, or the baseline's name, is checked before the (slow) capture: bad input writes nothing.
    plan, strategy = read_plan_file(args.strategy) if is_strategy_file(args.strategy) else (None, None)
    if plan is not None:
        check_plan(plan, strategy, spec.name, topology, f"--strategy {args.strategy}")
    else:
        check_strategy_name(args.strategy)
    graph, profiles = captured_with_profiles(args, spec)
    batch = args.batch_size or (plan or {}).get("batch_size")  # a plan is simulated at its own batch by default
    comm_model, uncalibrated = communication(args, topology)
    sim = Simulator(graph, topology, profiles, batch_size=batch, comm=comm_model)
    if plan is not None:
        check_plan(plan, strategy, spec.name, topology, f"--strategy {args.strategy}", len(graph.ops))
    else:
        strategy = load_strategy(args.strategy, sim)
    result = sim.run(strategy, timeline=bool(args.timeline))
    if args.timeline:
        from tag_core.simulate.timeline import save_timeline

        label = strategy.name or Path(args.strategy).stem
        save_timeline(result, graph, topology, args.timeline,
                      title=f"{spec.name} / {label} on {topology.name}, batch {sim.batch}: "
                            f"{result.iteration_time_s * 1e3:.1f} ms per iteration")
    data = {"model": spec.name, "topology": topology.name, "strategy": strategy.name or args.strategy,
            "batch_size": sim.batch, "profiled_types": sim.compute.profiled_types,
            "calibration": calibration_summary(comm_model, uncalibrated), **result.to_dict(topology)}
    if args.json:
        print_json(data)
        return 0
    print(f"{spec.name} on {topology.name} with {data['strategy']}, batch {sim.batch}")
    print(f"iteration time  {result.iteration_time_s * 1e3:10.2f} ms" + ("   OUT OF MEMORY" if result.oom else ""))
    comm = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in result.comm_s.items() if v)
    print(f"communication   {comm or 'none'}")
    calibration = data["calibration"]
    print(f"calibration     {calibration['hash'] if calibration['applied'] else 'none, ' + calibration['why']}")
    print(f"{'device':<24} {'gpu':<12} {'busy ms':>9} {'idle ms':>9} {'peak GB':>8} {'of GB':>6}")
    for d, dev in enumerate(topology.devices):
        name = f"{topology.machines[dev.machine].name}:{dev.local}"
        flag = "  OOM" if result.device_oom[d] else ""
        print(f"{name:<24} {dev.gpu.name:<12} {result.busy_s[d] * 1e3:9.2f} {result.idle_s[d] * 1e3:9.2f} "
              f"{result.peak_memory_bytes[d] / 1e9:8.2f} {result.memory_capacity_bytes[d] / 1e9:6.1f}{flag}")
    if args.timeline:
        print(f"timeline written to {args.timeline}")
    return 0
