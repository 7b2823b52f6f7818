"""`tag topology validate FILE` and `tag topology random [--seed S] [--gpus N [--racks R [--pods P]]]`; probe,
discover and diff are in `_topology_probe`."""

from __future__ import annotations

import json
from pathlib import Path

from tag_core.files import output_file, write_atomically

from ._common import print_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("topology", help="validate or generate cluster topology snapshots")
    sub = parser.add_subparsers(dest="topology_command", required=True)

    validate = sub.add_parser("validate", help="check a topology JSON file and summarise it")
    validate.add_argument("file", help="topology JSON file")
    validate.add_argument("--json", action="store_true", help="print the normalised topology and summary as JSON")
    validate.set_defaults(run=run_validate)

    rand = sub.add_parser("random", help="a random topology from the TAG paper's distribution, or of a given size")
    rand.add_argument("--seed", type=int, default=0, help="random seed (same arguments, same topology; default 0)")
    rand.add_argument("--gpus", type=int, help="exactly this many GPUs, in machines of 4 or 8 by GPU type")
    rand.add_argument("--racks", type=int, help="split the machines into this many racks (needs --gpus)")
    rand.add_argument("--pods", type=int, help="split the racks into this many pods (needs --racks)")
    rand.add_argument("--types", type=int, default=3, help="GPU types drawn (with --gpus; default 3)")
    rand.add_argument("--out", help="write the JSON here instead of printing it")
    rand.set_defaults(run=run_random)

    from ._topology_probe import register as register_discovery

    register_discovery(sub)


MAX_LINKS_SHOWN = 50
MAX_MACHINES_SHOWN = 50


def _fmt(x: float) -> str:
    return f"{x:g}"


def summary(topo) -> dict:
    return {
        "name": topo.name,
        "hash": topo.content_hash(),
        "num_machines": len(topo.machines),
        "num_devices": topo.num_devices,
        "gpu_types": topo.gpu_types(),
        **({"num_racks": topo.hierarchy.num_racks, "num_pods": topo.hierarchy.num_pods} if topo.racks else {}),
        "topology": topo.to_dict(),
    }


def _is_probe(path: str) -> bool:
    """A file from `tag topology probe` (its JSON has a `probe` version) rather than a topology."""
    try:
        data = json.loads(Path(path).read_bytes())
    except (OSError, ValueError, RecursionError):  # nested too deep, too
        return False  # load_topology says what is wrong with it
    return isinstance(data, dict) and "probe" in data


def run_validate(args) -> int:
    from tag_core.cluster.topology_json import load_topology

    probe = _is_probe(args.file)
    if probe:
        from tag_core.cluster.probe.discover import probe_file_topology

        topo = probe_file_topology(Path(args.file))
    else:
        topo = load_topology(args.file)
    if args.json:
        print_json(summary(topo))
        return 0
    print(f"topology {topo.name}: OK  (hash {topo.content_hash()})"
          + ("\na probe: checked as the topology `tag topology discover` makes of it alone" if probe else ""))
    inside = " inside a rack" if topo.racks else ""
    print(f"{len(topo.machines)} machines, {topo.num_devices} devices, inter-machine {_fmt(topo.inter_gbps)} Gbps{inside}")
    for line in _hierarchy_lines(topo):
        print(line)
    width = max(len("machine"), *(len(m.name) for m in topo.machines))
    gwidth = max(len("gpu"), *(len(m.gpu.name) for m in topo.machines))
    rwidth = max([len("rack")] + [len(m.rack) for m in topo.machines if m.rack is not None]) if topo.racks else 0
    rack_head = f"  {'rack':<{rwidth}}" if topo.racks else ""
    print(f"  {'#':>2}  {'machine':<{width}}  {'gpu':<{gwidth}}  {'count':>5}  {'intra Gbps':>10}{rack_head}  devices")
    first = 0  # devices are numbered machine-major: each machine's run follows the previous one's
    for i, m in enumerate(topo.machines[:MAX_MACHINES_SHOWN]):
        span = f"{first}" if m.count == 1 else f"{first}-{first + m.count - 1}"
        first += m.count
        rack = f"  {m.rack:<{rwidth}}" if topo.racks else ""
        print(f"  {i:>2}  {m.name:<{width}}  {m.gpu.name:<{gwidth}}  {m.count:>5}  {_fmt(m.intra_gbps):>10}{rack}  {span}")
    if len(topo.machines) > MAX_MACHINES_SHOWN:  # thousands of machines: a screenful, the rest in --json
        print(f"  ... and {len(topo.machines) - MAX_MACHINES_SHOWN:,} more machines (--json lists them all)")
    print("GPU types:")
    specs = {m.gpu.name: m.gpu for m in topo.machines}
    for name, count in topo.gpu_types().items():
        g = specs[name]
        print(f"  {name:<{gwidth}}  x{count:<3} {_fmt(g.tflops)} TFLOP/s FP32, {_fmt(g.mem_gb)} GB, {_fmt(g.mem_bw_gbps)} GB/s")
    if topo.links:
        print("links (override inter-machine bandwidth):")
        for a, b, gbps in topo.links[:MAX_LINKS_SHOWN]:
            print(f"  {a} <-> {b}: {_fmt(gbps)} Gbps")
        if len(topo.links) > MAX_LINKS_SHOWN:  # a per-pair matrix can make millions
            print(f"  ... and {len(topo.links) - MAX_LINKS_SHOWN:,} more (--json lists them all)")
    return 0


def _hierarchy_lines(topo) -> list[str]:
    """Racks, pods and their uplinks; nothing for a flat topology."""
    if not topo.racks:
        return []
    h = topo.hierarchy
    sizes = h.rack_machines
    spread = f"{sizes.min()}" if sizes.min() == sizes.max() else f"{sizes.min()}-{sizes.max()}"
    pods = f" in {h.num_pods} pods" if topo.pod_uplink is not None else ""
    lines = [f"{h.num_racks} racks{pods}, {spread} machines per rack"]
    for level, uplink in (("rack", topo.rack_uplink), ("pod", topo.pod_uplink)):
        if uplink is not None:
            latency = f", {_fmt(uplink.latency_us)} µs" if uplink.latency_us is not None else ""
            lines.append(f"  {level} uplink: {_fmt(uplink.gbps)} Gbps per flow, oversubscription "
                         f"{_fmt(uplink.oversubscription)}:1{latency}")
    return lines


def run_random(args) -> int:
    from tag_core.cluster.random_cluster import sized_topology
    from tag_core.cluster.topology import random_topology

    if args.out:
        output_file(args.out, "--out")
    sized = args.gpus is not None or args.racks is not None or args.pods is not None or args.types != 3
    topo = sized_topology(args.seed, args.gpus, args.racks, args.pods, args.types) if sized else random_topology(args.seed)
    # Thousands of machines: one line each keeps the file readable and small.
    text = json.dumps(topo.to_dict(), indent=2) + "\n" if topo.num_machines <= 64 else _compact(topo.to_dict())
    if args.out:
        out = Path(args.out)
        write_atomically(out, text, make_parents=False)
        print(f"wrote {out}: {len(topo.machines)} machines, {topo.num_devices} devices (hash {topo.content_hash()})")
    else:
        print(text, end="")
    return 0


def _compact(data: dict) -> str:
    """JSON with each machine and rack on its own line."""
    parts = [f'{{"name": {json.dumps(data["name"])},\n "machines": [\n']
    parts.append(",\n".join("  " + json.dumps(m) for m in data["machines"]))
    parts.append(f'],\n "inter_gbps": {json.dumps(data["inter_gbps"])}')
    for key in ("links", "racks"):
        if key in data:
            parts.append(f',\n "{key}": [\n' + ",\n".join("  " + json.dumps(x) for x in data[key]) + "]")
    if "uplinks" in data:
        parts.append(f',\n "uplinks": {json.dumps(data["uplinks"])}')
    parts.append("}\n")
    return "".join(parts)
