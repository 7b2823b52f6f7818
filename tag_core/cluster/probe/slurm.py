"""A Slurm allocation's hosts, their GPUs and racks: `scontrol show hostnames`, `sinfo -N -h -o "%N %G"` (each
node's GRES) and `scontrol show topology` (its switch tree: a leaf switch's nodes are one rack). Parsers of
the tools' text; `read` runs them here, or reads them from a recorded folder."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tag_core.errors import TagInputError

HOSTNAMES = "scontrol show hostnames"
SINFO = 'sinfo -N -h -o "%N %G"'
TOPOLOGY = "scontrol show topology"
RECORDED = {"scontrol-show-hostnames.txt": HOSTNAMES, "sinfo-gres.txt": SINFO,
            "scontrol-show-topology.txt": TOPOLOGY}


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host list syntax: `node[01-03,07],gpu5` -> node01 node02 node03 node07 gpu5."""
    hosts, depth, start = [], 0, 0
    parts = []
    for i, char in enumerate(text):
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    for part in (p.strip() for p in parts):
        if not part:
            continue
        match = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", part)
        if not match:
            if "[" in part or "]" in part:
                raise ValueError(f"unbalanced brackets in {part!r}")
            hosts.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for piece in ranges.split(","):
            low, _, high = piece.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise ValueError(f"{piece!r} is not a number or a range of numbers")
            for number in range(int(low), int(high or low) + 1):
                hosts += [f"{prefix}{str(number).zfill(len(low))}{tail}" for tail in expand_hostlist(suffix) or [""]]
    return hosts


def parse_hostnames(text: str, tool: str = HOSTNAMES) -> list[str]:
    hosts = [line.strip() for line in text.splitlines() if line.strip()]
    bad = next((n for n, host in enumerate(hosts, 1) if not re.fullmatch(r"[A-Za-z0-9._-]+", host)), None)
    if bad is not None:
        raise TagInputError(tool, f"line {bad}: {hosts[bad - 1]!r} is not a host name")
    if not hosts:
        raise TagInputError(tool, "printed no hosts")
    return hosts


@dataclass(frozen=True)
class Gres:
    gpu_type: str | None  # e.g. "v100"; None when the GRES names no type
    count: int


def parse_gres(text: str, tool: str = SINFO) -> dict[str, Gres]:
    """Each node's GPUs from `NODE GRES` lines, e.g. `node01 gpu:v100:4(S:0-1)`; nodes without GPUs left out."""
    nodes = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2:
            raise TagInputError(tool, f"line {number}: not `NODE GRES`: {line.strip()!r}")
        node, gres = fields
        for item in gres.split(","):
            item = re.sub(r"\(.*?\)$", "", item)  # socket affinity, e.g. (S:0-1)
            parts = item.split(":")
            if parts[0] != "gpu":
                continue
            if not parts[-1].isdigit():
                raise TagInputError(tool, f"line {number}: GRES {item!r} has no GPU count")
            gpu_type = parts[1] if len(parts) == 3 else None
            previous = nodes.get(node)
            nodes[node] = Gres(gpu_type if previous is None else previous.gpu_type,
                               int(parts[-1]) + (previous.count if previous else 0))
    return nodes


def parse_switches(text: str, tool: str = TOPOLOGY) -> dict[str, str]:
    """Host -> its leaf switch (a rack), from `SwitchName=s0 Level=0 LinkSpeed=1 Nodes=node[01-02]` lines."""
    racks = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        if "SwitchName" not in fields or "Level" not in fields:
            raise TagInputError(tool, f"line {number}: not a `SwitchName=… Level=…` line: {line.strip()!r}")
        if fields["Level"] == "0" and "Nodes" in fields:
            try:
                hosts = expand_hostlist(fields["Nodes"])
            except ValueError as exc:
                raise TagInputError(tool, f"line {number}: Nodes={fields['Nodes']}: {exc}") from None
            for host in hosts:
                racks[host] = fields["SwitchName"]
    return racks


def _run(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        raise TagInputError(argv[0], "not found on PATH: --slurm runs inside a Slurm allocation "
                                     "(or give --recorded DIR with the outputs)")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise TagInputError(" ".join(argv[:3]), f"exit {done.returncode}: {lines[-1] if lines else 'no output'}")
    return done.stdout


def read(recorded: Path | None, nodelist: str | None) -> tuple[list[str], dict[str, Gres], dict[str, str]]:
    """(hosts, their GPUs, their racks) of the allocation `nodelist` (default $SLURM_JOB_NODELIST)."""
    if recorded is not None:
        def get(name: str) -> str:
            path = recorded / name
            if not path.is_file():
                raise TagInputError("--recorded", f"{path} is missing (the output of `{RECORDED[name]}`)")
            return path.read_text(errors="replace")

        topology = recorded / "scontrol-show-topology.txt"
        return (parse_hostnames(get("scontrol-show-hostnames.txt")), parse_gres(get("sinfo-gres.txt")),
                parse_switches(topology.read_text()) if topology.is_file() else {})
    import os

    nodelist = nodelist or os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise TagInputError("--nodelist", "not given and SLURM_JOB_NODELIST is not set: not inside an allocation")
    hosts = parse_hostnames(_run(["scontrol", "show", "hostnames", nodelist]))
    gres = parse_gres(_run(["sinfo", "-N", "-h", "-n", ",".join(hosts), "-o", "%N %G"]))
    return hosts, gres, parse_switches(_run(["scontrol", "show", "topology"]))
