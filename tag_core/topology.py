"""Cluster topology: machines of identical GPUs, intra/inter-machine bandwidth, link overrides.

A snapshot is JSON (see `parse_topology`). A device group is one machine; devices are
flattened in machine-major order, so device i of the planner is `topology.devices[i]`.
Bandwidths are in Gbit/s throughout, as users quote them for networks and NVLink/PCIe.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import random
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from .errors import TagInputError
from .files import reject_json_constant
from .gpu_catalog import CATALOG, CATALOG_BY_LOWER, GpuType, is_catalog_entry, lookup_gpu


@dataclass(frozen=True)
class Machine:
    name: str
    gpu: GpuType
    count: int
    intra_gbps: float


@dataclass(frozen=True)
class Device:
    index: int  # position in Topology.devices (machine-major)
    machine: int  # index into Topology.machines
    local: int  # index within its machine
    gpu: GpuType


@dataclass(frozen=True)
class Topology:
    name: str
    machines: tuple[Machine, ...]
    inter_gbps: float
    links: tuple[tuple[str, str, float], ...] = ()  # (machine a, machine b, gbps) overrides of inter_gbps

    def __post_init__(self) -> None:
        # Semantic checks live here so programmatic construction is held to the same rules as JSON.
        _require(len(self.machines) > 0, "machines", "must list at least one machine")
        _number(self.inter_gbps, "inter_gbps", "gbps")
        seen: dict[str, int] = {}
        gpu_specs: dict[str, tuple[int, GpuType]] = {}
        for i, m in enumerate(self.machines):
            key = m.name.lower()
            _require(key not in seen, f"machines[{i}].name", f"duplicate machine name {m.name!r} (also machines[{seen.get(key)}]; names are case-insensitive)")
            seen[key] = i
            _count(m.count, f"machines[{i}].count")
            _number(m.intra_gbps, f"machines[{i}].intra_gbps", "gbps")
            if not is_catalog_entry(m.gpu):
                for figure in ("tflops", "mem_gb", "mem_bw_gbps"):
                    _number(getattr(m.gpu, figure), f"machines[{i}].gpu.{figure}", figure)
            # Profiles are keyed by GPU type name, so one name must mean one spec.
            prior = gpu_specs.setdefault(m.gpu.name.lower(), (i, m.gpu))
            _require(prior[1] == m.gpu, f"machines[{i}].gpu", f"GPU type {m.gpu.name!r} differs from its definition in machines[{prior[0]}]")
        pairs: dict[frozenset[int], int] = {}
        for j, (a, b, gbps) in enumerate(self.links):
            ia = seen.get(a.lower())
            ib = seen.get(b.lower())
            _require(ia is not None, f"links[{j}].a", f"unknown machine {a!r}")
            _require(ib is not None, f"links[{j}].b", f"unknown machine {b!r}")
            _require(ia != ib, f"links[{j}]", f"joins machine {a!r} to itself; set its intra_gbps instead")
            pair = frozenset((ia, ib))
            _require(pair not in pairs, f"links[{j}]", f"duplicate link between {a!r} and {b!r} (also links[{pairs.get(pair)}])")
            pairs[pair] = j
            _number(gbps, f"links[{j}].gbps", "gbps")
        total = sum(m.count for m in self.machines)
        _require(total <= MAX_DEVICES, "machines", f"{total} GPUs in all; TAG plans at most {MAX_DEVICES}")

    # -- derived views (cached: the simulator asks for them on every evaluation) --

    @cached_property
    def devices(self) -> tuple[Device, ...]:
        out: list[Device] = []
        for mi, m in enumerate(self.machines):
            for local in range(m.count):
                out.append(Device(index=len(out), machine=mi, local=local, gpu=m.gpu))
        return tuple(out)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def num_machines(self) -> int:
        return len(self.machines)

    @cached_property
    def _machine_index(self) -> dict[str, int]:
        return {m.name.lower(): i for i, m in enumerate(self.machines)}

    @cached_property
    def _link_gbps(self) -> dict[tuple[int, int], float]:
        out: dict[tuple[int, int], float] = {}
        for a, b, gbps in self.links:
            ia, ib = self._machine_index[a.lower()], self._machine_index[b.lower()]
            out[(ia, ib)] = out[(ib, ia)] = float(gbps)
        return out

    def machine_index(self, name: str) -> int:
        try:
            return self._machine_index[name.lower()]
        except KeyError:
            raise TagInputError("machine", f"unknown machine {name!r}; known: {', '.join(m.name for m in self.machines)}") from None

    def bandwidth_gbps(self, machine_a: int, machine_b: int) -> float:
        """Gbit/s between two machines (by index): intra if the same, else the link override or inter."""
        if machine_a == machine_b:
            return float(self.machines[machine_a].intra_gbps)
        return self._link_gbps.get((machine_a, machine_b), float(self.inter_gbps))

    @cached_property
    def _machine_matrix(self) -> np.ndarray:
        n = len(self.machines)
        mat = np.full((n, n), float(self.inter_gbps))
        for (ia, ib), gbps in self._link_gbps.items():
            mat[ia, ib] = gbps
        np.fill_diagonal(mat, [float(m.intra_gbps) for m in self.machines])
        mat.flags.writeable = False
        return mat

    def machine_bandwidth_matrix(self) -> np.ndarray:
        """M x M Gbit/s, diagonal = intra. Cached and read-only: copy before editing."""
        return self._machine_matrix

    @cached_property
    def device_machine(self) -> np.ndarray:
        """Machine index of every device (length D), read-only."""
        arr = np.array([d.machine for d in self.devices], dtype=np.int64)
        arr.flags.writeable = False
        return arr

    @cached_property
    def _device_matrix(self) -> np.ndarray:
        dm = self.device_machine
        mat = self._machine_matrix[np.ix_(dm, dm)].copy()
        mat.flags.writeable = False
        return mat

    def device_bandwidth_matrix(self) -> np.ndarray:
        """D x D Gbit/s: same machine (diagonal included) = intra, else inter or the link override.
        Cached and read-only: copy before editing."""
        return self._device_matrix

    # -- serialisation --

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "machines": [
                {
                    "name": m.name,
                    "gpu": m.gpu.name if is_catalog_entry(m.gpu) else m.gpu.to_dict(),
                    "count": m.count,
                    "intra_gbps": float(m.intra_gbps),
                }
                for m in self.machines
            ],
            "inter_gbps": float(self.inter_gbps),
        }
        if self.links:
            out["links"] = [{"a": a, "b": b, "gbps": float(g)} for a, b, g in self.links]
        return out

    def content_hash(self) -> str:
        """16 hex chars of sha256 over canonical JSON; link order and direction do not matter."""
        data = self.to_dict()
        if "links" in data:
            canon = []
            for link in data["links"]:
                a, b = sorted((link["a"], link["b"]), key=str.lower)
                canon.append({"a": a, "b": b, "gbps": link["gbps"]})
            data["links"] = sorted(canon, key=lambda l: (l["a"].lower(), l["b"].lower()))
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def gpu_types(self) -> dict[str, int]:
        """GPU type name -> device count, in first-seen order."""
        out: dict[str, int] = {}
        for m in self.machines:
            out[m.gpu.name] = out.get(m.gpu.name, 0) + m.count
        return out


# ---------------------------------------------------------------- validation helpers

# Bounds that keep the cost model's arithmetic finite: far wider than any real cluster (tests and
# what-if studies use tiny figures to force out-of-memory or slow links).
RANGES = {
    "gbps": (1e-9, 1e7, "Gbit/s"),
    "tflops": (1e-9, 1e6, "TFLOP/s"),
    "mem_gb": (1e-9, 1e6, "GB"),
    "mem_bw_gbps": (1e-9, 1e7, "GB/s"),
}
MAX_GPUS_PER_MACHINE = 1024
MAX_DEVICES = 4096


def _require(cond: bool, where: str, problem: str) -> None:
    if not cond:
        raise TagInputError(where, problem)


def _positive_int(value: Any) -> bool:
    # bool is an int subclass in Python; True must not pass as a count of 1.
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return f"{type(value).__name__} {value!r}" if isinstance(value, (int, float)) else type(value).__name__


def _object(value: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    _require(isinstance(value, dict), where or "topology", f"must be a JSON object, got {_describe(value)}")
    allowed = required + optional
    for key in value:
        if key not in allowed:
            hint = difflib.get_close_matches(str(key), allowed, n=1)
            extra = f"; did you mean {hint[0]!r}?" if hint else ""
            _require(False, _join(where, str(key)), f"unknown key (allowed: {', '.join(allowed)}){extra}")
    for key in required:
        _require(key in value, _join(where, key), "missing required field")
    return value


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _string(value: Any, where: str) -> str:
    _require(isinstance(value, str) and value.strip() != "", where, f"must be a non-empty string, got {_describe(value)}")
    return value.strip()


def _number(value: Any, where: str, kind: str) -> float:
    _require(_positive_number(value), where, f"must be a positive finite number, got {_describe(value)}")
    low, high, unit = RANGES[kind]
    _require(low <= value <= high, where, f"must be between {low:g} and {high:g} {unit}, got {value:g}")
    return float(value)


def _count(value: Any, where: str) -> int:
    _require(_positive_int(value), where, f"must be a positive integer, got {_describe(value)}")
    _require(value <= MAX_GPUS_PER_MACHINE, where, f"must be at most {MAX_GPUS_PER_MACHINE} GPUs, got {value}")
    return int(value)


def _gpu(value: Any, where: str) -> GpuType:
    if isinstance(value, str):
        return lookup_gpu(value, where)
    _require(isinstance(value, dict), where, f"must be a catalog GPU name or an object, got {_describe(value)}")
    obj = _object(value, where, ("name", "tflops", "mem_gb", "mem_bw_gbps"), ("fp16_tflops",))
    fp16 = obj.get("fp16_tflops")
    gpu = GpuType(
        name=_string(obj["name"], f"{where}.name"),
        tflops=_number(obj["tflops"], f"{where}.tflops", "tflops"),
        mem_gb=_number(obj["mem_gb"], f"{where}.mem_gb", "mem_gb"),
        mem_bw_gbps=_number(obj["mem_bw_gbps"], f"{where}.mem_bw_gbps", "mem_bw_gbps"),
        fp16_tflops=None if fp16 is None else _number(fp16, f"{where}.fp16_tflops", "tflops"),
    )
    # Profiles are keyed by GPU type name: a catalog name must mean the catalog's figures.
    catalog = CATALOG_BY_LOWER.get(gpu.name.lower())
    _require(catalog is None or catalog == gpu, f"{where}.name",
             f"{gpu.name!r} is a catalog GPU with other figures; give just the name, or name yours differently")
    return gpu


def parse_topology(data: Any, source: str = "topology") -> Topology:
    """Validate a JSON-shaped snapshot and build a Topology.

    Errors are TagInputError whose `where` is the field path (e.g. `machines[2].count`);
    `source` names the whole document when it is not an object at all.
    """
    _require(isinstance(data, dict), source, f"must be a JSON object, got {_describe(data)}")
    obj = _object(data, "", ("name", "machines", "inter_gbps"), ("links",))
    name = _string(obj["name"], "name")
    raw_machines = obj["machines"]
    _require(isinstance(raw_machines, list), "machines", f"must be a list, got {_describe(raw_machines)}")
    _require(len(raw_machines) > 0, "machines", "must list at least one machine")
    machines = []
    for i, raw in enumerate(raw_machines):
        where = f"machines[{i}]"
        m = _object(raw, where, ("name", "gpu", "count", "intra_gbps"))
        machines.append(
            Machine(
                name=_string(m["name"], f"{where}.name"),
                gpu=_gpu(m["gpu"], f"{where}.gpu"),
                count=_count(m["count"], f"{where}.count"),
                intra_gbps=_number(m["intra_gbps"], f"{where}.intra_gbps", "gbps"),
            )
        )
    raw_links = obj.get("links", [])
    _require(isinstance(raw_links, list), "links", f"must be a list, got {_describe(raw_links)}")
    if isinstance(obj["inter_gbps"], list):
        _require(not raw_links, "links", "cannot be combined with a per-pair inter_gbps matrix")
        inter, pair_links = _inter_matrix(obj["inter_gbps"], machines)
        return Topology(name=name, machines=tuple(machines), inter_gbps=inter, links=pair_links)
    inter = _number(obj["inter_gbps"], "inter_gbps", "gbps")
    # Links name machines case-insensitively; store the spelling used in `machines`.
    spelled = {m.name.lower(): m.name for m in machines}
    links = []
    for j, raw in enumerate(raw_links):
        where = f"links[{j}]"
        link = _object(raw, where, ("a", "b", "gbps"))
        ends = []
        for end in ("a", "b"):
            label = _string(link[end], f"{where}.{end}")
            _require(label.lower() in spelled, f"{where}.{end}", f"unknown machine {label!r}; known: {', '.join(m.name for m in machines)}")
            ends.append(spelled[label.lower()])
        links.append((ends[0], ends[1], _number(link["gbps"], f"{where}.gbps", "gbps")))
    return Topology(name=name, machines=tuple(machines), inter_gbps=inter, links=tuple(links))


def _inter_matrix(rows: Any, machines: list[Machine]) -> tuple[float, tuple[tuple[str, str, float], ...]]:
    """A per-pair matrix (one row per machine, symmetric, diagonal ignored) as inter_gbps plus links:
    its most common off-diagonal figure becomes inter_gbps, and every other pair a link."""
    n = len(machines)
    _require(len(rows) == n and all(isinstance(r, list) and len(r) == n for r in rows), "inter_gbps",
             f"a per-pair matrix must be {n}x{n}, one row and one column per machine")
    if n == 1:
        return 1.0, ()  # one machine: no inter-machine traffic; any positive figure stands in
    pairs = {}
    for i in range(n):
        for j in range(i + 1, n):
            gbps = _number(rows[i][j], f"inter_gbps[{i}][{j}]", "gbps")
            _require(_positive_number(rows[j][i]) and float(rows[j][i]) == gbps, f"inter_gbps[{j}][{i}]",
                     f"must equal inter_gbps[{i}][{j}] ({gbps:g}): a link has one bandwidth, got {_describe(rows[j][i])}")
            pairs[(i, j)] = gbps
    figures = sorted(pairs.values())
    inter = max(figures, key=figures.count)  # ties: the smallest of the most common
    links = tuple((machines[i].name, machines[j].name, g) for (i, j), g in pairs.items() if g != inter)
    return inter, links


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    # Python's json keeps the last of repeated keys; a snapshot that repeats one is ambiguous.
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one object")
        out[key] = value
    return out


def load_topology(path: str | Path) -> Topology:
    """Read and validate a snapshot file; file-level errors name the file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise TagInputError(str(p), f"cannot read topology file: {exc.strerror or exc}") from None
    return topology_from_json(data, str(p))


def topology_from_json(data: bytes | str, source: str) -> Topology:
    """Decode and validate a snapshot's JSON text (the CLI's files and the sensor's alike); errors name `source`."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise TagInputError(source, f"cannot read topology file: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        parsed = json.loads(text, parse_constant=reject_json_constant, object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, ValueError) as exc:
        raise TagInputError(source, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise TagInputError(source, "not valid JSON: nested too deeply") from None
    return parse_topology(parsed, source=source)


# ---------------------------------------------------------------- random topologies

# Pool for random clusters: the generations the TAG paper's experiments mixed.
RANDOM_GPU_POOL: tuple[str, ...] = ("V100-16GB", "P100-16GB", "GTX1080Ti", "T4", "A100-40GB")
RANDOM_MACHINES = (1, 6)
RANDOM_GPUS_PER_MACHINE = (1, 8)
RANDOM_INTRA_GBPS = (64.0, 160.0)
RANDOM_INTER_GBPS = (20.0, 50.0)


def random_topology(seed: int) -> Topology:
    """A cluster from the TAG paper's distribution, deterministic for `seed`.

    1-6 machines; 3 GPU types drawn from RANDOM_GPU_POOL per call, one type per machine;
    1-8 GPUs per machine; intra 64-160 Gbps per machine; inter 20-50 Gbps, and each
    machine pair gets its own 20-50 Gbps link with probability 1/2 so links are uneven.
    """
    rng = random.Random(f"tag-topology-{seed}")  # str seed: stable across Python versions
    types = rng.sample(RANDOM_GPU_POOL, 3)
    n = rng.randint(*RANDOM_MACHINES)
    machines = []
    for i in range(n):
        gpu = CATALOG[rng.choice(types)]
        machines.append(
            Machine(
                name=f"m{i}-{gpu.name.lower()}",
                gpu=gpu,
                count=rng.randint(*RANDOM_GPUS_PER_MACHINE),
                intra_gbps=round(rng.uniform(*RANDOM_INTRA_GBPS), 1),
            )
        )
    inter = round(rng.uniform(*RANDOM_INTER_GBPS), 1)
    links = []
    for a in range(n):
        for b in range(a + 1, n):
            if rng.random() < 0.5:
                links.append((machines[a].name, machines[b].name, round(rng.uniform(*RANDOM_INTER_GBPS), 1)))
    return Topology(name=f"random-{seed}", machines=tuple(machines), inter_gbps=inter, links=tuple(links))
