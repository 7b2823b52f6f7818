"""A Slurm allocation's hosts, their GPUs and racks: `scontrol show hostnames`, each node's GRES (`sinfo -N -h
-o "%N %G"`, any sinfo table with NODELIST and GRES columns, or `scontrol show node`) and `scontrol show
topology` (a leaf switch of topology/tree, or a block of topology/block, is one rack). Parsers of the tools'
text; `read` runs them here, or reads them from a recorded folder."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tag_core.errors import TagInputError

HOSTNAMES = "scontrol show hostnames"
SINFO = 'sinfo -N -h -o "%N %G"'
SCONTROL_NODE = "scontrol show node"
TOPOLOGY = "scontrol show topology"
RECORDED = {"scontrol-show-hostnames.txt": HOSTNAMES, "sinfo-gres.txt": SINFO,
            "scontrol-show-node.txt": SCONTROL_NODE, "scontrol-show-topology.txt": TOPOLOGY}


def split_top_level(text: str) -> list[str]:
    """`a[1-2,4],b(S:0,1),c` -> [a[1-2,4], b(S:0,1), c]: commas inside brackets or parentheses do not split."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += char in "[("
        depth -= char in "])"
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host list syntax: `node[01-03,07],gpu5` -> node01 node02 node03 node07 gpu5."""
    hosts = []
    for part in split_top_level(text):
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
    return list(dict.fromkeys(hosts))  # scontrol repeats a host listed twice


@dataclass(frozen=True)
class Gres:
    gpu_type: str | None  # e.g. "v100"; None when the GRES names no type
    count: int


def gpus_of(gres: str) -> Gres | None:
    """The GPUs of one GRES field (`gpu:v100:4(S:0-1),lscratch:3200`), None without any; ValueError when the
    field is cut short or mixes GPU types."""
    found = []
    for item in split_top_level(gres):
        parts = re.sub(r"\(.*\)$", "", item).split(":")  # socket affinity, e.g. (S:0-1)
        if parts[0] != "gpu":
            continue
        if len(parts) > 3 or not parts[-1].isdigit():
            raise ValueError(f"GRES {item!r} has no GPU count")
        found.append(Gres(parts[1] if len(parts) == 3 else None, int(parts[-1])))
    if not found:
        return None
    if len({g.gpu_type for g in found}) > 1:
        raise ValueError(f"GRES {gres!r} mixes GPU types on one node (give its probe with --with-probes)")
    return Gres(found[0].gpu_type, sum(g.count for g in found))


def _rows(text: str) -> tuple[str, list[tuple[int, str, str]]]:
    """(the tool, its (line, node list, GRES) rows) of any of the outputs Slurm prints GRES in: `scontrol show
    node` records, an `sinfo` table with a header naming NODELIST (or HOSTNAMES) and GRES columns, or `sinfo -h
    -o "%N %G"`'s two bare columns."""
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if lines and lines[0][1].lstrip().startswith("NodeName="):
        rows, current = [], None
        for number, line in lines:
            fields = dict(re.findall(r"(?<!\S)(\w+)=(\S*)", line))
            if "NodeName" in fields:
                current = [number, fields["NodeName"], "(null)"]
                rows.append(current)
            if "Gres" in fields:
                current[2] = fields["Gres"]
        return SCONTROL_NODE, [tuple(row) for row in rows]
    header = lines[0][1].upper().split() if lines else []
    node_column = next((header.index(name) for name in ("NODELIST", "HOSTNAMES") if name in header), None)
    if "GRES" in header and node_column is not None:
        columns, gres_column, body = len(header), header.index("GRES"), lines[1:]
    elif header and header[0] in ("NODELIST", "HOSTNAMES"):
        raise TagInputError("sinfo", "line 1: the table has no GRES column (add %G to its -o format)")
    else:
        columns, node_column, gres_column, body = 2, 0, 1, lines
    rows = []
    for number, line in body:
        fields = line.split()
        if len(fields) != columns:
            raise TagInputError("sinfo", f"line {number}: {len(fields)} fields where {columns} columns are "
                                         f"expected: {line.strip()!r}")
        rows.append((number, fields[node_column], fields[gres_column]))
    return "sinfo", rows


def parse_gres(text: str) -> dict[str, Gres]:
    """Each node's GPUs (nodes without GPUs left out) from `sinfo` or `scontrol show node`. A node listed twice
    (`sinfo -N` prints a node once per partition) must say the same both times."""
    tool, rows = _rows(text)
    nodes = {}
    for number, node_list, gres in rows:
        try:
            hosts, gpus = expand_hostlist(node_list), gpus_of(gres)
        except ValueError as exc:
            raise TagInputError(tool, f"line {number}: {exc} (cut off at the column's width? widen %N or %G "
                                      "in the format)") from None
        for host in hosts:
            if host in nodes and nodes[host] != gpus:
                raise TagInputError(tool, f"line {number}: {host} is listed again with other GPUs ({gres})")
            nodes[host] = gpus
    return {host: gpus for host, gpus in nodes.items() if gpus is not None}


def parse_switches(text: str) -> dict[str, str]:
    """Host -> its rack: the leaf switch of topology/tree (`SwitchName=s0 Level=0 LinkSpeed=1 Nodes=node[01-02]`)
    or the block of topology/block (`BlockName=block01 BlockIndex=0 Nodes=node[000-017] BlockSize=18`)."""
    racks = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        if "BlockName" in fields:
            rack = fields["BlockName"]
        elif "SwitchName" in fields and "Level" in fields:
            rack = fields["SwitchName"] if fields["Level"] == "0" else None
        else:
            raise TagInputError(TOPOLOGY, f"line {number}: neither a `SwitchName=… Level=…` nor a `BlockName=…` "
                                          f"line: {line.strip()!r}")
        if rack is None or "Nodes" not in fields:
            continue
        try:
            hosts = expand_hostlist(fields["Nodes"])
        except ValueError as exc:
            raise TagInputError(TOPOLOGY, f"line {number}: Nodes={fields['Nodes']}: {exc}") from None
        for host in hosts:
            racks.setdefault(host, rack)
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
    """(hosts, their GPUs, their racks) of the allocation `nodelist` (default $SLURM_JOB_NODELIST). From a
    recorded folder: the hosts of `--nodelist` or of scontrol-show-hostnames.txt, the GRES of sinfo-gres.txt or
    scontrol-show-node.txt, and the racks of scontrol-show-topology.txt where there is one."""
    if recorded is not None:
        def text(name: str) -> str | None:
            path = recorded / name
            return path.read_text(errors="replace") if path.is_file() else None

        if nodelist:
            try:
                hosts = list(dict.fromkeys(expand_hostlist(nodelist)))
            except ValueError as exc:
                raise TagInputError("--nodelist", str(exc)) from None
        elif (listed := text("scontrol-show-hostnames.txt")) is not None:
            hosts = parse_hostnames(listed)
        else:
            raise TagInputError("--recorded", f"{recorded} has no scontrol-show-hostnames.txt (the output of "
                                              f"`{HOSTNAMES}`); give it, or --nodelist")
        gres = text("sinfo-gres.txt") or text("scontrol-show-node.txt")
        if gres is None:
            raise TagInputError("--recorded", f"{recorded} has neither sinfo-gres.txt (`{SINFO}`) nor "
                                              f"scontrol-show-node.txt (`{SCONTROL_NODE}`)")
        topology = text("scontrol-show-topology.txt")
        return hosts, parse_gres(gres), parse_switches(topology) if topology else {}
    import os

    nodelist = nodelist or os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise TagInputError("--nodelist", "not given and SLURM_JOB_NODELIST is not set: not inside an allocation")
    hosts = parse_hostnames(_run(["scontrol", "show", "hostnames", nodelist]))
    gres = parse_gres(_run(["sinfo", "-N", "-h", "-n", ",".join(hosts), "-o", "%N %G"]))
    return hosts, gres, parse_switches(_run(["scontrol", "show", "topology"]))
