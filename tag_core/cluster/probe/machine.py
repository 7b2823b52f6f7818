"""One machine's part of a topology, read from the machine itself (or from a recorded probe: a folder of the
same commands' outputs, one file each, named as RECORDED names them).

A probe is plain JSON: the GPUs `nvidia-smi` lists, each mapped onto the catalog; every GPU pair's class
from `nvidia-smi topo -m` with its nominal Gbit/s; the NICs; and the topology `machines` (one per GPU type in
the box, so a box of mixed GPUs becomes machines joined by `links`) that `discover` merges. Without GPUs
(no nvidia-smi, or it lists none) the machine is one `cpu` device.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

from tag_core.errors import TagInputError

from ..gpu_catalog import CATALOG, normalise_device_name
from . import network
from .links import pair_gbps, ring_gbps
from .nvidia_smi import (
    LIST,
    QUERY_GPU,
    TOPO,
    Gpu,
    parse_gpu_list,
    parse_gpu_query,
    parse_smi_table,
    parse_topology_matrix,
)

PROBE_VERSION = 1
# The command each recorded file holds the output of.
RECORDED = {"hostname.txt": "hostname", "nvidia-smi-query-gpu.csv": QUERY_GPU, "nvidia-smi.txt": "nvidia-smi",
            "nvidia-smi-L.txt": LIST,
            "nvidia-smi-topo-m.txt": TOPO, "sys-class-net-speed.txt": network.NET_SPEED,
            "sys-class-infiniband-rate.txt": network.IB_RATE, "ibstat.txt": network.IBSTAT}
# What a machine of one CPU device gets as intra figure: nothing crosses it, but the format wants one.
CPU_INTRA_GBPS = 100.0


class Outputs:
    """The commands' outputs: run here, or read from a recorded folder (a file missing there: not run)."""

    def __init__(self, recorded: Path | None = None) -> None:
        if recorded is not None and not recorded.is_dir():
            raise TagInputError("--recorded", f"{recorded} is not a folder of recorded outputs")
        self.recorded = recorded

    def get(self, file_name: str) -> str | None:
        command = RECORDED[file_name]
        if self.recorded is not None:
            path = self.recorded / file_name
            return path.read_text(errors="replace") if path.is_file() else None
        if command == "hostname":
            return socket.gethostname()
        if command.startswith("grep . /sys/"):
            return network.read_live(command)
        argv = command.split()
        if shutil.which(argv[0]) is None:
            return None
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode:
            lines = (done.stderr or done.stdout).strip().splitlines()
            raise TagInputError(command, f"exit {done.returncode}: {lines[-1] if lines else 'no output'}")
        return done.stdout

    def where(self) -> str:
        return f"recorded in {self.recorded}" if self.recorded is not None else "this machine"


def probe(recorded: Path | None = None, catalog: dict[str, dict] | None = None) -> dict:
    """This machine's probe (or the recorded one's). `catalog`: inline GPU objects by nvidia-smi name, for
    GPUs the built-in catalog does not know."""
    outputs = Outputs(recorded)
    host = (outputs.get("hostname.txt") or "").strip() or (recorded.name if recorded else "localhost")
    gpus = _gpus(outputs)
    nics = _nics(outputs)
    if not gpus:
        machines = [{"name": host, "gpu": "cpu", "count": 1, "intra_gbps": CPU_INTRA_GBPS}]
        return _probe(host, outputs, [], [], nics, machines, [], [f"{host}.intra_gbps: one CPU device, nothing crosses it"])
    types = [gpu_type_of(gpu, catalog or {}) for gpu in gpus]
    pairs = _pairs(outputs, gpus)
    machines, links, nominal = group_machines(host, types, {(a, b): gbps for a, b, _, gbps in pairs})
    return _probe(host, outputs, gpus, [(gpus[a].index, gpus[b].index, c, g) for a, b, c, g in pairs],
                  nics, machines, links, nominal, types)


def group_machines(host: str, types: list, bandwidth: dict[tuple[int, int], float]) -> tuple[list, list, list]:
    """(topology machines, in-box links, nominal figures) of a box whose GPU at position i is of `types[i]`,
    `bandwidth[(i, j)]` Gbit/s apart (i < j): one machine per GPU type, joined at their fastest pair."""
    by_type: dict[str, list[int]] = {}
    for position, gpu_type in enumerate(types):
        by_type.setdefault(_type_name(gpu_type), []).append(position)
    machines, links, nominal = [], [], []
    for name, members in by_type.items():
        machine_name = host if len(by_type) == 1 else f"{host}-{name.lower()}"
        inside = {pair: gbps for pair, gbps in bandwidth.items() if set(pair) <= set(members)}
        intra = ring_gbps(inside, members) if len(members) > 1 else max(bandwidth.values(), default=16.0)
        machines.append({"name": machine_name, "gpu": types[members[0]], "count": len(members), "intra_gbps": intra})
        nominal.append(f"{machine_name}.intra_gbps: the best ring over nvidia-smi topo -m's classes, nominal rates")
    groups = list(by_type.values())
    for i, first in enumerate(groups):
        for j in range(i + 1, len(groups)):
            cross = [gbps for (a, b), gbps in bandwidth.items()
                     if (a in first and b in groups[j]) or (b in first and a in groups[j])]
            links.append({"a": machines[i]["name"], "b": machines[j]["name"], "gbps": max(cross)})
    return machines, links, nominal


def regroup(probe_json: dict) -> dict:
    """A probe's machines made again from its `gpus` and `pairs`, so that an edited probe (a GPU deleted
    from it) says what it now holds."""
    if not probe_json.get("gpus"):
        return probe_json
    specs = {_type_name(m["gpu"]): m["gpu"] for m in probe_json["machines"]}
    gpus = probe_json["gpus"]
    position = {f"GPU{g['index']}": i for i, g in enumerate(gpus)}
    bandwidth = {tuple(sorted((position[p["a"]], position[p["b"]]))): p["gbps"] for p in probe_json["pairs"]
                 if p["a"] in position and p["b"] in position}
    machines, links, nominal = group_machines(probe_json["host"], [specs.get(g["type"], g["type"]) for g in gpus],
                                              bandwidth)
    return {**probe_json, "machines": machines, "links": links, "nominal": nominal}


def _probe(host, outputs, gpus, pairs, nics, machines, links, nominal, types=()) -> dict:
    return {"probe": PROBE_VERSION, "host": host, "source": outputs.where(),
            "gpus": [{"index": g.index, "name": g.name, "type": _type_name(t), "memory_mib": g.memory_mib,
                      "bus_id": g.bus_id, "uuid": g.uuid} for g, t in zip(gpus, types)],
            "pairs": [{"a": f"GPU{a}", "b": f"GPU{b}", "class": c, "gbps": g} for a, b, c, g in pairs],
            "nics": [{"name": n.name, "kind": n.kind, "gbps": n.gbps} for n in nics],
            "machines": machines, "links": links, "nominal": nominal}


def _gpus(outputs: Outputs) -> list[Gpu]:
    query = outputs.get("nvidia-smi-query-gpu.csv")
    if query is not None:
        return parse_gpu_query(query) if query.strip() else []
    if outputs.recorded is not None and (table := outputs.get("nvidia-smi.txt")) is not None:
        return parse_smi_table(table)  # what is published most often; live, the query above answers
    listing = outputs.get("nvidia-smi-L.txt")
    if listing is not None and listing.strip():
        return parse_gpu_list(listing)
    return []


def _pairs(outputs: Outputs, gpus: list[Gpu]) -> list[tuple[int, int, str, float]]:
    """(position a, position b, class, nominal Gbit/s) of every GPU pair, a < b."""
    text = outputs.get("nvidia-smi-topo-m.txt")
    if text is None:
        raise TagInputError(TOPO, f"no output ({outputs.where()}): GPUs are listed, but not how they connect")
    matrix = parse_topology_matrix(text)
    columns = {int(name.removeprefix("GPU")): name for name in matrix.gpus}
    missing = [g.index for g in gpus if g.index not in columns]
    if missing:
        raise TagInputError(TOPO, f"has no column for GPU {missing[0]} of the {len(gpus)} nvidia-smi lists")
    return [(a, b, matrix.between(columns[gpus[a].index], columns[gpus[b].index]),
             pair_gbps(matrix.between(columns[gpus[a].index], columns[gpus[b].index]), gpus[a].name, gpus[b].name))
            for a in range(len(gpus)) for b in range(a + 1, len(gpus))]


def _nics(outputs: Outputs) -> list[network.Nic]:
    nics = []
    if (text := outputs.get("sys-class-net-speed.txt")) is not None:
        nics += network.parse_net_speeds(text)
    if (text := outputs.get("sys-class-infiniband-rate.txt")) is not None:
        nics += network.parse_ib_rates(text)
    elif (text := outputs.get("ibstat.txt")) is not None:
        nics += network.parse_ibstat(text)
    return nics


def gpu_type_of(gpu: Gpu, catalog: dict[str, dict]):
    """A catalog name, or the user's inline object for this nvidia-smi name; else one line saying how to add it."""
    if gpu.name in catalog:
        return catalog[gpu.name]
    described = gpu.name if gpu.memory_mib is None else f"{gpu.name} {round(gpu.memory_mib / 1024)}GB"
    name = normalise_device_name(described)
    if name in CATALOG and name != "cpu":
        return name
    raise TagInputError("nvidia-smi", f"GPU {gpu.index} is a {gpu.name!r}, which the catalog does not know; "
                                      f"give its figures with --catalog FILE, a JSON object "
                                      f"{{{json.dumps(gpu.name)}: {{\"name\": …, \"tflops\": …, \"mem_gb\": …, "
                                      "\"mem_bw_gbps\": …}}, the inline GPU object of topology files")


def _type_name(gpu_type) -> str:
    return gpu_type["name"] if isinstance(gpu_type, dict) else gpu_type

