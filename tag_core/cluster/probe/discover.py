"""Probes of many machines merged into one topology snapshot: their `machines` and in-box `links`, and
between machines the slower of the two machines' fastest NICs. Figures no tool reported (a virtual NIC's
speed) take `default_inter_gbps`; every figure here is nominal until `tag calibrate` measures it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tag_core.errors import TagInputError

from ..topology import Topology
from ..topology_json import parse_topology
from .links import pair_gbps
from .machine import PROBE_VERSION, gpu_type_of, regroup
from .nvidia_smi import Gpu

DEFAULT_INTER_GBPS = 10.0


def read_probes(folder: Path) -> list[dict]:
    """Every `*.json` probe in `folder` (one a machine), in name order."""
    if not folder.is_dir():
        raise TagInputError("--probes", f"{folder} is not a folder of probe files")
    files = sorted(folder.glob("*.json"))
    if not files:
        raise TagInputError("--probes", f"{folder} holds no *.json probes (write them with `tag topology probe`)")
    return [read_probe(path) for path in files]


def read_probe(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TagInputError(str(path), f"not a probe: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or data.get("probe") != PROBE_VERSION or not data.get("machines"):
        raise TagInputError(str(path), f"not a probe of version {PROBE_VERSION} (from `tag topology probe`)")
    return regroup(data)


def merge(probes: list[dict], name: str, default_inter_gbps: float = DEFAULT_INTER_GBPS,
          racks: dict[str, str] | None = None, uplink: dict | None = None) -> tuple[dict, list[str]]:
    """(topology JSON, the nominal figures in words). `racks`: host -> rack name (Slurm's switches);
    `uplink`: the racks' uplink ({gbps, oversubscription?}); without it, the machines' own link speed."""
    hosts = Counter(p["host"].lower() for p in probes)
    twice = [host for host, n in hosts.items() if n > 1]
    if twice:
        raise TagInputError("probes", f"host {twice[0]!r} is probed more than once")
    machines, links, nominal, best_nic = [], [], [], {}
    for p in probes:
        fastest = max((n["gbps"] for n in p["nics"] if n.get("gbps")), default=None)
        if fastest is None:
            nominal.append(f"{p['host']}: no NIC reports a speed; {default_inter_gbps:g} Gbit/s assumed")
        for machine in p["machines"]:
            entry = dict(machine)
            if racks is not None:
                entry["rack"] = racks.get(p["host"], racks.get(p["host"].split(".")[0], "unplaced"))
            machines.append(entry)
            best_nic[machine["name"]] = fastest or default_inter_gbps
        links += p.get("links", [])
        nominal += p.get("nominal", [])
    names = [m["name"] for m in machines]
    in_box = {frozenset((link["a"], link["b"])) for link in links}
    pair_gbps = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if frozenset((a, b)) not in in_box:
                pair_gbps[(a, b)] = min(best_nic[a], best_nic[b])
    inter = Counter(pair_gbps.values()).most_common(1)[0][0] if pair_gbps else min(best_nic.values())
    links += [{"a": a, "b": b, "gbps": gbps} for (a, b), gbps in pair_gbps.items() if gbps != inter]
    topology = {"name": name, "machines": machines, "inter_gbps": inter}
    if links:
        topology["links"] = links
    if racks is not None:
        topology["racks"] = [{"name": rack} for rack in sorted({m["rack"] for m in machines})]
        if uplink is None:
            uplink = {"gbps": inter}
            nominal.append(f"uplinks.rack: {inter:g} Gbit/s, not oversubscribed (no tool reports a rack's "
                           "uplink; give --uplink-gbps and --oversubscription)")
        topology["uplinks"] = {"rack": uplink}
        rack = {m["name"]: m["rack"] for m in machines}  # a link may not join two racks: the uplink does
        topology["links"] = [link for link in links if rack[link["a"]] == rack[link["b"]]]
        if not topology["links"]:
            del topology["links"]
    parse_topology(topology, source=name)  # what it writes validates
    return topology, nominal


def probe_file_topology(path: Path) -> Topology:
    """The topology of one probe file alone (what `discover` makes of it), named after its host."""
    probe = read_probe(path)
    return parse_topology(merge([probe], probe["host"])[0], source=str(path))


def probes_topology(folder: Path, name: str) -> Topology:
    """The validated topology of a probe folder (a snapshot source of the sensor)."""
    topology, _ = merge(read_probes(folder), name)
    return parse_topology(topology, source=str(folder))


def host_probe(host: str, gpu_name: str, count: int, memory_mib: float | None, source: str,
               catalog: dict[str, dict] | None = None) -> dict:
    """A probe made from what a scheduler knows of a host (its GPU model and count): no pair classes, so the
    machine's inside is the GPU generation's PCIe x16 figure, nominal."""
    gpu_type = gpu_type_of(Gpu(0, gpu_name, memory_mib, None, None), catalog or {})
    intra = pair_gbps("PIX", gpu_name, gpu_name)
    return {"probe": PROBE_VERSION, "host": host, "source": source, "gpus": [], "pairs": [], "nics": [],
            "machines": [{"name": host, "gpu": gpu_type, "count": count, "intra_gbps": intra}], "links": [],
            "nominal": [f"{host}.intra_gbps: PCIe x16 ({source} says nothing of NVLink; probe it for its classes)"]}
