"""`tag topology validate FILE` and `tag topology random --seed S`."""

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

    rand = sub.add_parser("random", help="a random topology from the TAG paper's distribution")
    rand.add_argument("--seed", type=int, required=True, help="random seed (same seed, same topology)")
    rand.add_argument("--out", help="write the JSON here instead of printing it")
    rand.set_defaults(run=run_random)


MAX_LINKS_SHOWN = 50


def _fmt(x: float) -> str:
    return f"{x:g}"


def summary(topo) -> dict:
    return {
        "name": topo.name,
        "hash": topo.content_hash(),
        "num_machines": len(topo.machines),
        "num_devices": topo.num_devices,
        "gpu_types": topo.gpu_types(),
        "topology": topo.to_dict(),
    }


def run_validate(args) -> int:
    from tag_core.cluster.topology_json import load_topology

    topo = load_topology(args.file)
    if args.json:
        print_json(summary(topo))
        return 0
    print(f"topology {topo.name}: OK  (hash {topo.content_hash()})")
    print(f"{len(topo.machines)} machines, {topo.num_devices} devices, inter-machine {_fmt(topo.inter_gbps)} Gbps")
    width = max(len("machine"), *(len(m.name) for m in topo.machines))
    gwidth = max(len("gpu"), *(len(m.gpu.name) for m in topo.machines))
    print(f"  {'#':>2}  {'machine':<{width}}  {'gpu':<{gwidth}}  {'count':>5}  {'intra Gbps':>10}  devices")
    first = 0  # devices are numbered machine-major: each machine's run follows the previous one's
    for i, m in enumerate(topo.machines):
        span = f"{first}" if m.count == 1 else f"{first}-{first + m.count - 1}"
        first += m.count
        print(f"  {i:>2}  {m.name:<{width}}  {m.gpu.name:<{gwidth}}  {m.count:>5}  {_fmt(m.intra_gbps):>10}  {span}")
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


def run_random(args) -> int:
    from tag_core.cluster.topology import random_topology

    if args.out:
        output_file(args.out, "--out")
    topo = random_topology(args.seed)
    text = json.dumps(topo.to_dict(), indent=2) + "\n"
    if args.out:
        out = Path(args.out)
        write_atomically(out, text, make_parents=False)
        print(f"wrote {out}: {len(topo.machines)} machines, {topo.num_devices} devices (hash {topo.content_hash()})")
    else:
        print(text, end="")
    return 0
