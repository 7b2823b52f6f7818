"""`tag calibrate`: measure a TF runtime's transfers, collectives and fixed costs; fit the cost terms.

    tag calibrate --local N --out local.json          this machine as N pinned one-core tasks
    tag calibrate --topology FILE --cluster cluster.json [--task-index K]
                                                      a real cluster (K > 0 serves task K)
    tag calibrate --export FILE [--topology NAME]     a stored calibration as JSON
    tag calibrate --import FILE                       a calibration measured elsewhere
"""

from __future__ import annotations

import argparse
import sys

from ._common import (
    non_negative_int,
    positive_float,
    positive_int,
    positive_int_list,
    print_json,
    require,
)

_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "M": 2**20, "MB": 2**20, "G": 2**30, "GB": 2**30}
MAX_SIZE = 2**30  # gRPC carries a tensor in one message of under 2 GB


def byte_sizes(text: str) -> list[int]:
    """'4K,64K,1M' -> [4096, 65536, 1048576]: binary units, multiples of 4 bytes (float32 elements)."""
    sizes = []
    for part in filter(None, (p.strip().upper() for p in text.split(","))):
        number = part.rstrip("KMGB")
        unit = part[len(number):]
        if not number.isdigit() or unit not in _UNITS:
            raise argparse.ArgumentTypeError(f"must be comma-separated sizes such as 4K,64K,1M,64M, got {part!r}")
        size = int(number) * _UNITS[unit]
        if not 4 <= size <= MAX_SIZE or size % 4:
            raise argparse.ArgumentTypeError(f"sizes must be multiples of 4 bytes between 4 B and 1G, got {part!r}")
        sizes.append(size)
    if not sizes:
        raise argparse.ArgumentTypeError(f"must name at least one size, got {text!r}")
    return sorted(set(sizes))


def register(subparsers) -> None:
    parser = subparsers.add_parser("calibrate", help="measure a TF runtime and fit the cost model's terms to it")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--local", type=positive_int, metavar="N",
                      help="calibrate this machine as N single-device tasks, each a TF server on 127.0.0.1 pinned "
                           "to its own core with one thread (2 <= N <= the cores this process may use)")
    mode.add_argument("--cluster", metavar="CLUSTER_JSON",
                      help="calibrate a real cluster: its cluster.json as `tag emit` writes it (with --topology)")
    mode.add_argument("--export", metavar="FILE", help="write a stored calibration to FILE as JSON")
    mode.add_argument("--import", dest="import_file", metavar="FILE", help="store a calibration JSON file")
    parser.add_argument("--topology", help="with --cluster: the cluster's topology snapshot JSON; with --export: "
                                           "the topology (name or snapshot file) whose newest calibration to write")
    parser.add_argument("--task-index", type=non_negative_int, default=0,
                        help="with --cluster: this machine's task; 0 measures, K > 0 serves task K until stopped")
    parser.add_argument("--out", help="with --local: where to write the topology JSON of this machine")
    parser.add_argument("--name", help="with --local: the topology's name (default local-N)")
    parser.add_argument("--sizes", type=byte_sizes, default=None,
                        help="payload sizes (default 4K,64K,1M,16M,64M)")
    parser.add_argument("--repeats", type=positive_int, default=7, help="timed runs per measurement (default 7)")
    parser.add_argument("--warmup", type=positive_int, default=2, help="untimed runs first (default 2)")
    parser.add_argument("--group-sizes", type=positive_int_list,
                        help="collective group sizes (default 2, the powers of two, and all tasks)")
    parser.add_argument("--timeout", type=positive_float, default=60.0,
                        help="seconds one measured step may take before the run is stopped (default 60)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the calibration as JSON")
    parser.set_defaults(run=run)


def run(args) -> int:
    for flag, allowed in (("out", args.local), ("name", args.local), ("sizes", args.local or args.cluster),
                          ("group_sizes", args.local or args.cluster)):
        require(getattr(args, flag) is None or allowed is not None, f"--{flag.replace('_', '-')}",
                "only applies to --local" if flag in ("out", "name") else "only applies to --local and --cluster")
    require(args.task_index == 0 or args.cluster is not None, "--task-index", "only applies to --cluster")
    require(args.topology is None or args.cluster is not None or args.export is not None, "--topology",
            "only applies to --cluster and --export")
    if args.import_file is not None:
        return run_import(args)
    if args.export is not None:
        return run_export(args)
    return run_measure(args)


def _settings(args):
    from tag_core.runtime.calibrate import DEFAULT_SIZES, CalibrationSettings

    sizes = tuple(args.sizes or DEFAULT_SIZES)
    require(len(sizes) >= 2, "--sizes", "give at least two sizes: a latency + bandwidth fit needs two")
    return CalibrationSettings(sizes=sizes, repeats=args.repeats, warmup=args.warmup,
                               group_sizes=tuple(args.group_sizes) if args.group_sizes else None,
                               step_timeout_s=args.timeout)


def run_measure(args) -> int:
    from tag_core.files import output_file
    from tag_core.runtime.calibrate import CalibrationError
    from tag_core.runtime.calibration_report import fit_lines, summary
    from tag_core.runtime.calibration_run import calibrate_and_store, read_cluster_file
    from tag_core.runtime.local_cluster import ServerStartError, pinnable_cores

    settings = _settings(args)
    topology, cluster, out = None, None, None
    if args.local is not None:
        cores = pinnable_cores()
        require(args.local >= 2, "--local", f"must be at least 2 (transfers need two tasks), got {args.local}")
        require(args.local <= len(cores), "--local", f"{args.local} tasks need {args.local} cores to run in parallel; "
                                                     f"this process may use {len(cores)}")
        require(args.out is not None, "--out", "is required with --local: the topology JSON to write")
        require(args.name is None or args.name.strip() != "", "--name", "must not be empty")
        out = output_file(args.out, "--out")
    else:
        from tag_core.cluster.topology_json import load_topology

        require(args.topology is not None, "--topology", "is required with --cluster: the cluster's snapshot JSON")
        topology = load_topology(args.topology)
        cluster = read_cluster_file(args.cluster, topology.num_machines)
        require(args.task_index < topology.num_machines, "--task-index",
                f"must be below the cluster's {topology.num_machines} tasks")
        if args.task_index > 0:
            return serve_task(cluster, args.task_index, topology.machines[args.task_index].count)
    try:
        calibration, topology, wall = calibrate_and_store(settings, args.db, local=args.local, name=args.name,
                                                          topology=topology, cluster=cluster, out=out,
                                                          progress=not args.quiet)
    except CalibrationError as exc:
        print(f"tag: error: calibration failed: {exc}", file=sys.stderr)
        return 1
    except ServerStartError as exc:
        print(f"tag: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print_json({**summary(calibration), "topology_file": str(out) if out else args.topology, "wall_s": wall})
        return 0
    where = f"{args.local} local tasks" if args.local else f"{topology.num_machines} tasks of {args.cluster}"
    print(f"calibrated {topology.name} ({where}) in {wall:.1f} s: calibration {calibration.calibration_hash}, "
          f"topology hash {calibration.topology_hash}")
    if out is not None:
        print(f"wrote {out}: {topology.num_machines} machines of one 'cpu' device, "
              f"inter {topology.inter_gbps:g} Gbit/s")
    print("\n".join(fit_lines(calibration)))
    return 0


def serve_task(cluster: dict[str, list[str]], task: int, devices: int) -> int:
    from tag_core.runtime.local_cluster import serve

    print(f"tag: serving task {task} of {len(cluster['worker'])} at {cluster['worker'][task]}; stop this command "
          "when task 0's calibration is done", file=sys.stderr)
    serve(cluster, task, devices=devices, threads=None, exit_with_parent=False)
    return 0


def run_import(args) -> int:
    from tag_core.cluster.calibration_transfer import import_calibration
    from tag_core.runtime.calibration_report import fit_lines, summary

    calibration, note = import_calibration(args.import_file, args.db)
    if note is not None:
        print(f"tag: note: {note}", file=sys.stderr)
    if args.json:
        print_json(summary(calibration))
        return 0
    print(f"imported calibration {calibration.calibration_hash} of {calibration.topology} (snapshot "
          f"{calibration.topology_hash}, measured on {calibration.host or 'an unnamed host'}): "
          f"{len(calibration.samples)} samples")
    print("\n".join(fit_lines(calibration)))
    return 0


def run_export(args) -> int:
    from tag_core.cluster.calibration_transfer import export_calibration
    from tag_core.runtime.calibration_report import summary

    calibration = export_calibration(args.export, args.db, args.topology)
    if args.json:
        print_json({**summary(calibration), "file": args.export})
        return 0
    print(f"wrote {args.export}: calibration {calibration.calibration_hash} of {calibration.topology} "
          f"({len(calibration.samples)} samples)")
    return 0

