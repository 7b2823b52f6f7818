"""`tag topology probe`, `tag topology discover` and `tag topology diff`: topologies read from the machines,
and what changed between two."""

from __future__ import annotations

import json
from pathlib import Path

from tag_core.errors import TagInputError
from tag_core.files import output_file, write_atomically


def register(sub) -> None:
    probe = sub.add_parser("probe", help="this machine's part of a topology, from nvidia-smi and sysfs, as JSON")
    probe.add_argument("--recorded", metavar="DIR",
                       help="read the tools' outputs from files in DIR (nvidia-smi-topo-m.txt, ...) instead")
    probe.add_argument("--catalog", metavar="FILE",
                       help="JSON object: nvidia-smi GPU name -> inline GPU object, for GPUs the catalog lacks")
    probe.add_argument("--out", help="write the probe here instead of printing it")
    probe.set_defaults(run=run_probe)

    discover = sub.add_parser("discover", help="one validated topology from probes, a Slurm allocation or a "
                                               "Kubernetes node list")
    hosts = discover.add_mutually_exclusive_group(required=True)
    hosts.add_argument("--probes", metavar="DIR", help="a folder of probe JSON files, one a machine")
    hosts.add_argument("--slurm", action="store_true",
                       help="the hosts of a Slurm allocation (scontrol, sinfo GRES; leaf switches as racks)")
    hosts.add_argument("--kubernetes", metavar="NODES_FILE",
                       help="the GPU nodes of `kubectl get nodes -o json` or `-o yaml` (GPU feature discovery labels)")
    discover.add_argument("--recorded", metavar="DIR",
                          help="with --slurm: the outputs of scontrol and sinfo, from files in DIR")
    discover.add_argument("--nodelist", help="with --slurm: the hosts (default $SLURM_JOB_NODELIST)")
    discover.add_argument("--with-probes", metavar="DIR",
                          help="with --slurm or --kubernetes: probes of (some of) the hosts, for their GPU pairs")
    discover.add_argument("--catalog", metavar="FILE", help="as for probe: GPUs the catalog lacks")
    discover.add_argument("--name", default="discovered", help="the topology's name (default: discovered)")
    discover.add_argument("--inter-gbps", type=float, default=None,
                          help="between machines whose NICs report no speed (default 10, nominal)")
    discover.add_argument("--uplink-gbps", type=float, default=None,
                          help="with racks: each rack's uplink, Gbit/s (default: the machines' own link speed)")
    discover.add_argument("--oversubscription", type=float, default=None,
                          help="with racks: the uplink's oversubscription ratio (default 1)")
    discover.add_argument("--out", help="write the topology here instead of printing it")
    discover.set_defaults(run=run_discover)

    diff = sub.add_parser("diff", help="what changed between two topology snapshots, in words")
    diff.add_argument("old", help="the earlier topology JSON file")
    diff.add_argument("new", help="the later one")
    diff.set_defaults(run=run_diff)


def _catalog(path: str | None) -> dict[str, dict]:
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise TagInputError("--catalog", f"{path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise TagInputError("--catalog", f"{path}: must be an object of nvidia-smi name -> inline GPU object")
    return data


def _emit(text: str, out: str | None, what: str) -> None:
    if out is None:
        print(text, end="")
        return
    write_atomically(Path(out), text, make_parents=False)
    print(f"wrote {out}: {what}")


def run_probe(args) -> int:
    from tag_core.cluster.probe.machine import probe

    if args.out:
        output_file(args.out, "--out")
    catalog = _catalog(args.catalog)
    result = probe(Path(args.recorded) if args.recorded else None, catalog)
    devices = sum(m["count"] for m in result["machines"])
    kinds = ", ".join(f"{m['count']} x {m['gpu'] if isinstance(m['gpu'], str) else m['gpu']['name']}"
                      for m in result["machines"])
    _emit(json.dumps(result, indent=1) + "\n", args.out, f"{result['host']}: {devices} devices ({kinds})")
    return 0


def run_discover(args) -> int:
    from tag_core.cluster.probe.discover import DEFAULT_INTER_GBPS, merge

    if args.out:
        output_file(args.out, "--out")
    for flag, gbps in (("--inter-gbps", args.inter_gbps), ("--uplink-gbps", args.uplink_gbps)):
        if gbps is not None and not 0 < gbps < float("inf"):
            raise TagInputError(flag, f"must be a positive number of Gbit/s, got {gbps:g}")
    if (args.recorded or args.nodelist) and not args.slurm:
        raise TagInputError("--recorded" if args.recorded else "--nodelist", "goes with --slurm")
    if args.with_probes and args.probes:
        raise TagInputError("--with-probes", "goes with --slurm or --kubernetes")
    if args.oversubscription is not None and not 1 <= args.oversubscription < float("inf"):
        raise TagInputError("--oversubscription", f"must be a ratio of at least 1, got {args.oversubscription:g}")
    probes, racks, said = _hosts(args)
    uplink = None
    if args.uplink_gbps is not None or args.oversubscription is not None:
        if racks is None:
            raise TagInputError("--uplink-gbps" if args.uplink_gbps is not None else "--oversubscription",
                                "the hosts have no racks (Slurm's topology or a rack or zone label names them)")
        if args.uplink_gbps is None:
            raise TagInputError("--uplink-gbps", "is needed with --oversubscription")
        uplink = {"gbps": args.uplink_gbps, "oversubscription": args.oversubscription or 1.0}
    topology, nominal = merge(probes, args.name, args.inter_gbps or DEFAULT_INTER_GBPS, racks, uplink)
    text = json.dumps(topology, indent=1) + "\n"
    devices = sum(m["count"] for m in topology["machines"])
    _emit(text, args.out, f"{len(probes)} hosts, {len(topology['machines'])} machines, {devices} devices{said}")
    if args.out:  # on stdout the topology alone, so that it pipes
        print("nominal figures (until `tag calibrate` measures them):")
        for line in nominal:
            print(f"  {line}")
    return 0


def run_diff(args) -> int:
    from tag_core.cluster.topology_diff import describe_changes
    from tag_core.cluster.topology_json import load_topology

    changes = describe_changes(load_topology(args.old), load_topology(args.new))
    for line in changes or ["no change"]:
        print(line)
    return 0


def _hosts(args) -> tuple[list[dict], dict[str, str] | None, str]:
    """(a probe per host, host -> rack or None, a note for the summary line) from the chosen source."""
    from tag_core.cluster.probe import kubernetes, slurm
    from tag_core.cluster.probe.discover import host_probe, read_probes

    if args.probes:
        return read_probes(Path(args.probes)), None, ""
    catalog = _catalog(args.catalog)
    probed = {p["host"]: p for p in read_probes(Path(args.with_probes))} if args.with_probes else {}
    if args.slurm:
        hosts, gres, switches = slurm.read(Path(args.recorded) if args.recorded else None, args.nodelist)
        gpu_hosts = [h for h in hosts if h in gres or h in probed]
        if not gpu_hosts:
            raise TagInputError("--slurm", f"none of the {len(hosts)} hosts has GPUs in its GRES")
        untyped = next((h for h in gpu_hosts if h not in probed and gres[h].gpu_type is None), None)
        if untyped:
            raise TagInputError("sinfo", f"{untyped}: its GRES names no GPU type (gpu:{gres[untyped].count}); "
                                         "give its probe with --with-probes")
        probes = [probed.get(h) or host_probe(h, gres[h].gpu_type, gres[h].count, None, "Slurm's GRES", catalog)
                  for h in gpu_hosts]
        racks = {h: switches.get(h, "unplaced") for h in gpu_hosts} if switches else None
        left = len(hosts) - len(gpu_hosts)
        return probes, racks, f" ({left} hosts without GPUs left out)" if left else ""
    nodes, without = kubernetes.read_nodes(Path(args.kubernetes))
    if not nodes:
        raise TagInputError("--kubernetes", f"none of the {without} nodes has nvidia.com/gpu.* labels")
    probes = [probed.get(n.name) or host_probe(n.name, n.product.replace("-", " "), n.count, n.memory_mib,
                                               "Kubernetes' labels", catalog) for n in nodes]
    places = {n.name: n.rack or n.zone for n in nodes}
    racks = {name: place or "unplaced" for name, place in places.items()} if any(places.values()) else None
    return probes, racks, f" ({without} nodes without GPUs left out)" if without else ""
