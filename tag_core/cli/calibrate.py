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
import time
from pathlib import Path

from ._common import non_negative_int, open_store, positive_float, positive_int, positive_int_list, print_json, require

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
    from tag_core.runtime.calibrate import CalibrationError, calibrate_cluster, calibrate_local
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
    open_store(args).close()  # a store that cannot be opened fails now, not after the measurements
    started = time.monotonic()
    try:
        if topology is None:
            calibration, topology = calibrate_local(args.local, settings, name=args.name, progress=not args.quiet)
        else:
            calibration = calibrate_cluster(topology, cluster, settings, progress=not args.quiet)
    except CalibrationError as exc:
        print(f"tag: error: calibration failed: {exc}", file=sys.stderr)
        return 1
    except ServerStartError as exc:
        print(f"tag: error: {exc}", file=sys.stderr)
        return 1
    wall = time.monotonic() - started
    _save(args, calibration)  # one transaction first: the store is what may be busy; the file was checked
    if out is not None:
        _write_topology(topology, out)
    if args.json:
        print_json({**summary(calibration), "topology_file": str(out) if out else args.topology, "wall_s": wall})
        return 0
    where = f"{args.local} local tasks" if args.local else f"{topology.num_machines} tasks of {args.cluster}"
    print(f"calibrated {topology.name} ({where}) in {wall:.1f} s: calibration {calibration.calibration_hash}, "
          f"topology hash {calibration.topology_hash}")
    if out is not None:
        print(f"wrote {out}: {topology.num_machines} machines of one 'cpu' device, "
              f"inter {topology.inter_gbps:g} Gbit/s")
    print_fits(calibration)
    return 0


def _write_topology(topology, out: Path) -> None:
    import json

    from tag_core.files import write_atomically

    write_atomically(out, json.dumps(topology.to_dict(), indent=2) + "\n", make_parents=False)


def _save(args, calibration) -> None:
    from tag_core.cluster.calibration import save_to_store

    conn = open_store(args)
    try:
        save_to_store(conn, calibration)
    finally:
        conn.close()


def read_cluster_file(path: str, tasks: int) -> dict[str, list[str]]:
    """The "cluster" of a cluster.json as `tag emit` writes it: {"cluster": {"worker": ["host:port", ...]}}."""
    from tag_core.files import input_file, read_json

    data = read_json(input_file(path, "--cluster"), "--cluster")
    spec = data.get("cluster") if isinstance(data, dict) else None
    workers = spec.get("worker") if isinstance(spec, dict) else None
    require(isinstance(workers, list) and all(isinstance(w, str) and ":" in w for w in workers), "--cluster",
            f'{path}: cluster.worker must be a list of "host:port" strings')
    require(len(workers) == tasks, "--cluster", f"{path} lists {len(workers)} workers; the topology has {tasks} "
                                                "machines (task K = machine K)")
    return {"worker": workers}


def serve_task(cluster: dict[str, list[str]], task: int, devices: int) -> int:
    from tag_core.runtime.local_cluster import serve

    print(f"tag: serving task {task} of {len(cluster['worker'])} at {cluster['worker'][task]}; stop this command "
          "when task 0's calibration is done", file=sys.stderr)
    serve(cluster, task, devices=devices, threads=None, exit_with_parent=False)
    return 0


def run_import(args) -> int:
    from tag_core import store
    from tag_core.cluster.calibration_json import read_calibration_file
    from tag_core.files import input_file

    calibration = read_calibration_file(input_file(args.import_file, "--import"), "--import")
    _save(args, calibration)
    conn = open_store(args, read_only=True)
    try:
        snapshot = store.latest_topology_snapshot(conn, calibration.topology)
    finally:
        conn.close()
    if snapshot is not None and snapshot["content_hash"] != calibration.topology_hash:
        print(f"tag: note: the store's snapshot of {calibration.topology} is {snapshot['content_hash']}; this "
              f"calibration was measured for {calibration.topology_hash}", file=sys.stderr)
    if args.json:
        print_json(summary(calibration))
        return 0
    print(f"imported calibration {calibration.calibration_hash} of {calibration.topology} (snapshot "
          f"{calibration.topology_hash}, measured on {calibration.host or 'an unnamed host'}): "
          f"{len(calibration.samples)} samples")
    print_fits(calibration)
    return 0


def run_export(args) -> int:
    from tag_core import store
    from tag_core.cluster.calibration import load_from_store
    from tag_core.cluster.calibration_json import write_calibration_file

    name = args.topology
    if name is not None and name.endswith(".json") and Path(name).is_file():
        from tag_core.cluster.topology_json import load_topology

        name = load_topology(name).name
    conn = open_store(args, read_only=True)
    try:
        known = sorted(set(store.list_calibrations(conn).topology))
        if name is None:
            require(len(known) > 0, "--export", "the store holds no calibration; run `tag calibrate --local N` "
                                                "or --import one")
            require(len(known) == 1, "--topology", f"the store holds calibrations of {', '.join(known)}; name one")
            name = known[0]
        calibration = load_from_store(conn, topology=name)
    finally:
        conn.close()
    require(calibration is not None, "--topology", f"no calibration of {name!r} is stored"
            + (f"; stored: {', '.join(known)}" if known else ""))
    write_calibration_file(calibration, args.export)
    if args.json:
        print_json({**summary(calibration), "file": args.export})
        return 0
    print(f"wrote {args.export}: calibration {calibration.calibration_hash} of {calibration.topology} "
          f"({len(calibration.samples)} samples)")
    return 0


# ---------------------------------------------------------------- output


def summary(calibration) -> dict:
    return {"calibration_hash": calibration.calibration_hash, "topology": calibration.topology,
            "topology_hash": calibration.topology_hash, "source": calibration.source, "host": calibration.host,
            "code_version": calibration.code_version, **calibration.terms(), "measured": medians(calibration)}


def medians(calibration) -> list[dict]:
    """Per measured series: median and spread (min, max) of its samples."""
    from collections import defaultdict
    from statistics import median

    groups = defaultdict(list)
    for s in calibration.samples:
        groups[(s.kind, s.link, s.group_size, s.bytes)].append(s.seconds)
    return [{"kind": kind, "link": link, "group_size": size, "bytes": nbytes, "median_s": median(times),
             "min_s": min(times), "max_s": max(times), "runs": len(times)}
            for (kind, link, size, nbytes), times in groups.items()]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-4 else f"{seconds * 1e6:.2f} us"


def _measured_ms(seconds: float | None) -> str:
    return "not measured" if seconds is None else _ms(seconds)


def print_fits(calibration) -> None:
    from tag_core.runtime.calibration_graphs import format_bytes

    print(f"  {'fit (latency + bytes / bandwidth)':<34} {'latency':>10} {'Gbit/s':>8} {'resid. rms':>11} "
          f"{'max rel':>8} {'samples':>7}")
    for kind, link, size, fit in calibration.fits():
        label = f"{kind} {link}" + (f" x{size}" if kind != "p2p" else "")
        print(f"  {label:<34} {_ms(fit.latency_s):>10} {fit.gbps:>8.3g} {_ms(fit.residual_rms_s):>11} "
              f"{fit.residual_max_rel:>8.1%} {fit.samples:>7}")
    o = calibration.overheads
    hidden = "not measured" if o.compute_overlap is None else f"{o.compute_overlap:.0%}"
    print(f"  overheads: per op {_ms(o.per_op_s)}, per step {_ms(o.per_step_s)}, per send/recv pair "
          f"{_ms(o.per_transfer_s)}; transfers that compute hides: {hidden}; each more independent transfer: "
          f"{_measured_ms(o.transfer_gap_s)}; a sender that has just begun computing holds a transfer: "
          f"{_measured_ms(o.busy_send_s)}")
    print(f"  {'measured (per transfer, collective, op or step)':<48} {'median':>10} {'min':>10} {'max':>10} runs")
    for row in medians(calibration):
        label = " ".join(str(x) for x in (row["kind"], row["link"]) if x)
        if row["kind"] in ("allreduce", "ps", "broadcast", "step"):
            label += f" x{row['group_size']}"
        if row["bytes"]:
            label += f" {format_bytes(row['bytes'])}"
        print(f"  {label:<48} {_ms(row['median_s']):>10} {_ms(row['min_s']):>10} {_ms(row['max_s']):>10} "
              f"{row['runs']:>4}")
