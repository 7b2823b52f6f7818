"""What `nvidia-smi` says of a machine's GPUs: the list (`--query-gpu=...`, or `-L`) and the connection
matrix of `nvidia-smi topo -m`. Parsers of the tools' text, nothing else: a malformed or truncated output
is one line naming the tool and the line."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tag_core.errors import TagInputError

QUERY_GPU = "nvidia-smi --query-gpu=index,name,memory.total,pci.bus_id,uuid --format=csv"
TOPO = "nvidia-smi topo -m"
LIST = "nvidia-smi -L"
# How two GPUs (or a GPU and a NIC) connect, as the legend of `topo -m` names them; SOC is older drivers' SYS.
CLASSES = ("X", "SYS", "SOC", "NODE", "PHB", "PXB", "PIX")
_NVLINK = re.compile(r"NV(\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: float | None
    bus_id: str | None
    uuid: str | None


def malformed(tool: str, line_number: int, problem: str) -> TagInputError:
    return TagInputError(tool, f"line {line_number}: {problem}")


def parse_gpu_query(text: str, tool: str = QUERY_GPU) -> list[Gpu]:
    """The CSV of `--query-gpu=index,name,memory.total,pci.bus_id,uuid --format=csv` (its header names the
    columns; `noheader` output is read in that order)."""
    lines = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise TagInputError(tool, "printed nothing: no GPUs, or the output is empty")
    columns = ["index", "name", "memory.total", "pci.bus_id", "uuid"]
    if not lines[0][1].split(",")[0].strip().isdigit():  # a header
        columns = [re.sub(r"\s*\[.*\]$", "", c.strip()) for c in lines[0][1].split(",")]
        lines = lines[1:]
    if "name" not in columns:
        raise malformed(tool, 1, f"no name column in the header {', '.join(columns)}")
    gpus = []
    for number, line in lines:
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(columns):
            raise malformed(tool, number, f"{len(cells)} fields, the header has {len(columns)}: {line!r}")
        row = dict(zip(columns, cells))
        index = row.get("index", str(len(gpus)))
        if not index.isdigit():
            raise malformed(tool, number, f"index {index!r} is not a number")
        gpus.append(Gpu(int(index), row["name"], _mib(row.get("memory.total"), tool, number),
                        row.get("pci.bus_id"), row.get("uuid")))
    return gpus


def _mib(text: str | None, tool: str, number: int) -> float | None:
    if text is None or text in ("", "[N/A]", "N/A"):
        return None
    match = re.fullmatch(r"([\d.]+)\s*(MiB|GiB)?", text)
    if not match:
        raise malformed(tool, number, f"memory {text!r} is not a size in MiB")
    return float(match[1]) * (1024 if match[2] == "GiB" else 1)


def parse_gpu_list(text: str, tool: str = LIST) -> list[Gpu]:
    """`nvidia-smi -L`: `GPU 0: Tesla V100-SXM2-16GB (UUID: GPU-…)` a line (MIG lines under a GPU are skipped)."""
    gpus = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("MIG "):
            continue
        match = re.fullmatch(r"\s*GPU (\d+): (.+?)(?: \(UUID: ([^)]+)\))?\s*", line)
        if not match:
            raise malformed(tool, number, f"not a `GPU <n>: <name> (UUID: …)` line: {line.strip()!r}")
        gpus.append(Gpu(int(match[1]), match[2].strip(), None, None, match[3]))
    if not gpus:
        raise TagInputError(tool, "printed no GPU lines")
    return gpus


_TABLE_GPU = re.compile(r"\|\s+(\d+)\s+(.+?)\s+(?:On|Off)\s+\|\s+([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f.]+)\s")
_TABLE_MEMORY = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")


def parse_smi_table(text: str, tool: str = "nvidia-smi") -> list[Gpu]:
    """Plain `nvidia-smi`'s table: a GPU's first row holds its index, name (cut short with `...` when long) and
    bus id, the next its memory use `used / total`."""
    gpus, lines = [], text.splitlines()
    for number, line in enumerate(lines, 1):
        match = _TABLE_GPU.match(line)
        if not match:
            continue
        memory = _TABLE_MEMORY.search(lines[number]) if number < len(lines) else None
        if memory is None:
            raise malformed(tool, number + 1, "no `used MiB / total MiB` below the GPU's row (truncated?)")
        gpus.append(Gpu(int(match[1]), match[2].strip(), float(memory[2]), match[3], None))
    if not gpus and "NVIDIA-SMI" in text:
        return []  # a driver and no GPUs
    if not gpus:
        raise TagInputError(tool, "no GPU rows and no NVIDIA-SMI banner: not the output of nvidia-smi")
    return gpus


@dataclass(frozen=True)
class TopologyMatrix:
    """`topo -m`'s matrix: its devices (GPUs, then NICs) and the class of each pair, e.g. `NV2` or `PIX`."""

    devices: tuple[str, ...]
    cells: dict[tuple[str, str], str]

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if re.fullmatch(r"GPU\d+", d)]

    @property
    def nics(self) -> list[str]:
        return [d for d in self.devices if not re.fullmatch(r"GPU\d+", d)]

    def between(self, a: str, b: str) -> str:
        return self.cells[(a, b)]


def link_class(cell: str) -> str:
    """A cell as one class: `NV#` (# bonded NVLinks), or a PCIe path class of CLASSES."""
    return "SYS" if cell == "SOC" else cell


def parse_topology_matrix(text: str, tool: str = TOPO) -> TopologyMatrix:
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header_at = next((n for n, line in enumerate(lines) if re.match(r"\s+GPU0\b", line)), None)
    if header_at is None:
        raise TagInputError(tool, "no header line starting with GPU0: not the output of `nvidia-smi topo -m`")
    header = lines[header_at].split()
    # Device columns come first; the affinity columns ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID") follow.
    devices = []
    for token in header:
        if token in ("CPU", "NUMA", "GPU") or token.endswith("Affinity"):
            break
        devices.append(token)
    cells: dict[tuple[str, str], str] = {}
    rows = 0
    for number, line in enumerate(lines[header_at + 1:], header_at + 2):
        if not line.strip():
            if rows:
                break
            continue
        if line.strip().startswith(("Legend", "NIC Legend")):
            break
        tokens = line.split()
        name, values = tokens[0], tokens[1:1 + len(devices)]
        if name not in devices:
            raise malformed(tool, number, f"row {name!r} is not a column of the header")
        for position, (column, value) in enumerate(zip(devices, values)):
            if value not in CLASSES and not _NVLINK.fullmatch(value):
                if re.fullmatch(r"[\d,\-]+|N/A", value):  # an affinity column where a device's should be
                    break
                raise malformed(tool, number, f"{name}/{column}: unknown connection {value!r} "
                                              "(known: X, NV#, PIX, PXB, PHB, NODE, SYS)")
            cells[(name, column)] = link_class(value)
        else:
            position = len(values)
        if position < len(devices):
            raise malformed(tool, number, f"{position} entries for {len(devices)} devices (truncated?)")
        rows += 1
    missing = [d for d in devices if (d, d) not in cells]
    if missing:
        raise TagInputError(tool, f"no row for {', '.join(missing)} (truncated output?)")
    for (a, b), value in cells.items():
        if cells[(b, a)] != value:
            raise TagInputError(tool, f"{a}/{b} is {value} but {b}/{a} is {cells[(b, a)]}")
    return TopologyMatrix(tuple(devices), cells)


def nvlinks(cell: str) -> int:
    """How many bonded NVLinks a class names (0 for a PCIe path)."""
    match = _NVLINK.fullmatch(cell)
    return int(match[1]) if match else 0
