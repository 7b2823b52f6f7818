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

    discover = sub.add_parser("discover", help="merge probes of many machines into one validated topology")
    discover.add_argument("--probes", metavar="DIR", required=True, help="a folder of probe JSON files, one a machine")
    discover.add_argument("--name", default="discovered", help="the topology's name (default: discovered)")
    discover.add_argument("--inter-gbps", type=float, default=None,
                          help="between machines whose NICs report no speed (default 10, nominal)")
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
    from tag_core.cluster.probe.discover import DEFAULT_INTER_GBPS, merge, read_probes

    if args.out:
        output_file(args.out, "--out")
    if args.inter_gbps is not None and not 0 < args.inter_gbps < float("inf"):
        raise TagInputError("--inter-gbps", f"must be a positive number of Gbit/s, got {args.inter_gbps:g}")
    probes = read_probes(Path(args.probes))
    topology, nominal = merge(probes, args.name, args.inter_gbps or DEFAULT_INTER_GBPS)
    text = json.dumps(topology, indent=1) + "\n"
    devices = sum(m["count"] for m in topology["machines"])
    _emit(text, args.out, f"{len(probes)} probes, {len(topology['machines'])} machines, {devices} devices")
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
