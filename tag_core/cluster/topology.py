"""Cluster topology: machines of identical GPUs, intra/inter-machine bandwidth, link overrides,
and optionally racks and pods joined by oversubscribed uplinks (hierarchy.py).

A snapshot is JSON (see `parse_topology`). A device group is one machine; devices are
flattened in machine-major order, so device i of the planner is `topology.devices[i]`.
Bandwidths are in Gbit/s throughout, as users quote them for networks and NVLink/PCIe.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from tag_core.errors import TagInputError

from .fields import MAX_DEVICES, RANGES, bounded_number, gpu_count, is_positive_number, require
from .gpu_catalog import CATALOG, GpuType, is_catalog_entry
from .hierarchy import LEVEL_POD, LEVEL_RACK, Hierarchy, Rack, Uplink, check_hierarchy


@dataclass(frozen=True)
class Machine:
    name: str
    gpu: GpuType
    count: int
    intra_gbps: float
    rack: str | None = None  # a name in Topology.racks; None in a flat topology


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
    racks: tuple[Rack, ...] = ()  # empty: flat, one rack in one pod
    rack_uplink: Uplink | None = None  # out of each rack to the others of its pod
    pod_uplink: Uplink | None = None  # out of each pod to the other pods

    def __post_init__(self) -> None:
        # Semantic checks live here so programmatic construction is held to the same rules as JSON.
        require(len(self.machines) > 0, "machines", "must list at least one machine")
        bounded_number(self.inter_gbps, "inter_gbps", "gbps")
        seen: dict[str, int] = {}
        gpu_specs: dict[str, tuple[int, GpuType]] = {}
        for i, m in enumerate(self.machines):
            key = m.name.lower()
            require(key not in seen, f"machines[{i}].name", f"duplicate machine name {m.name!r} (also machines[{seen.get(key)}]; names are case-insensitive)")
            seen[key] = i
            gpu_count(m.count, f"machines[{i}].count")
            bounded_number(m.intra_gbps, f"machines[{i}].intra_gbps", "gbps")
            if not is_catalog_entry(m.gpu):
                for figure in ("tflops", "mem_gb", "mem_bw_gbps"):
                    bounded_number(getattr(m.gpu, figure), f"machines[{i}].gpu.{figure}", figure)
            # Profiles are keyed by GPU type name, so one name must mean one spec.
            prior = gpu_specs.setdefault(m.gpu.name.lower(), (i, m.gpu))
            require(prior[1] == m.gpu, f"machines[{i}].gpu", f"GPU type {m.gpu.name!r} differs from its definition in machines[{prior[0]}]")
        check_hierarchy([m.rack for m in self.machines], self.racks, self.rack_uplink, self.pod_uplink)
        pairs: dict[tuple[int, int], int] = {}
        low, high, _ = RANGES["gbps"]
        for j, (a, b, gbps) in enumerate(self.links):
            # A per-pair matrix can make millions of links: messages are built only on failure.
            ia = seen.get(a.lower())
            ib = seen.get(b.lower())
            pair = (ia, ib) if ia is None or ib is None or ia < ib else (ib, ia)
            if ia is None or ib is None or ia == ib or pair in pairs or not (
                    is_positive_number(gbps) and low <= gbps <= high):
                require(ia is not None, f"links[{j}].a", f"unknown machine {a!r}")
                require(ib is not None, f"links[{j}].b", f"unknown machine {b!r}")
                require(ia != ib, f"links[{j}]", f"joins machine {a!r} to itself; set its intra_gbps instead")
                require(pair not in pairs, f"links[{j}]", f"duplicate link between {a!r} and {b!r} (also links[{pairs.get(pair)}])")
                bounded_number(gbps, f"links[{j}].gbps", "gbps")
            pairs[pair] = j
        if self.racks:  # a link's figure replaces inter_gbps, the in-rack level: across racks the uplinks decide
            rack = self.hierarchy.machine_rack
            for j, (ia, ib) in enumerate(self._link_pairs):
                require(rack[ia] == rack[ib], f"links[{j}]", f"joins machines in racks {self.machines[ia].rack!r} and "
                        f"{self.machines[ib].rack!r}; across racks bandwidth comes from uplinks.rack")
        total = sum(m.count for m in self.machines)
        require(total <= MAX_DEVICES, "machines", f"{total} GPUs in all; TAG plans at most {MAX_DEVICES}")

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
    def _link_pairs(self) -> list[tuple[int, int]]:
        return [(self._machine_index[a.lower()], self._machine_index[b.lower()]) for a, b, _ in self.links]

    @cached_property
    def _link_gbps(self) -> dict[tuple[int, int], float]:
        out: dict[tuple[int, int], float] = {}
        for (ia, ib), (_, _, gbps) in zip(self._link_pairs, self.links):
            out[(ia, ib)] = out[(ib, ia)] = float(gbps)
        return out

    @cached_property
    def hierarchy(self) -> Hierarchy:
        """Racks and pods as index arrays; a flat topology is one rack in one pod."""
        return Hierarchy.build([m.rack for m in self.machines], self.racks, self.rack_uplink, self.pod_uplink)

    @cached_property
    def _link_table(self) -> tuple[np.ndarray, np.ndarray]:
        """Link overrides as sorted keys min*M + max and their Gbit/s: looked up with searchsorted."""
        n = len(self.machines)
        keys = np.array([min(a, b) * n + max(a, b) for a, b in self._link_pairs], dtype=np.int64)
        order = np.argsort(keys)
        return keys[order], np.array([float(g) for _, _, g in self.links], dtype=np.float64)[order]

    @cached_property
    def machine_intra_gbps(self) -> np.ndarray:
        """(M,) each machine's intra_gbps, read-only."""
        arr = np.array([float(m.intra_gbps) for m in self.machines], dtype=np.float64)
        arr.flags.writeable = False
        return arr

    def pair_gbps(self, a, b) -> np.ndarray:
        """Gbit/s one flow gets alone between machines a and b (index arrays, broadcast): intra_gbps on one
        machine; the link override or inter_gbps inside a rack; across racks the rack uplink's gbps, across
        pods the slower of the rack's and the pod's. Contention: `hierarchy.rack_uplink.flow_gbps`."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        a, b = np.broadcast_arrays(a, b)
        out = np.full(a.shape, float(self.inter_gbps))
        if self.links:
            keys, figures = self._link_table
            wanted = np.minimum(a, b) * len(self.machines) + np.maximum(a, b)
            at = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
            found = keys[at] == wanted
            out = np.where(found, figures[at], out)
        out = np.where(a == b, self.machine_intra_gbps[a], out)
        h = self.hierarchy
        if h.hierarchical:
            level = h.level(a, b)
            out = np.where(level == LEVEL_POD, h.lone_flow_gbps(LEVEL_POD), out)
            if h.pod_uplink is not None:
                out = np.where(level > LEVEL_POD, h.lone_flow_gbps(LEVEL_POD + 1), out)
        return out

    def pair_level(self, a, b) -> np.ndarray:
        """The level of each machine pair: hierarchy.LEVEL_MACHINE, LEVEL_RACK, LEVEL_POD or LEVEL_CLUSTER."""
        return self.hierarchy.level(a, b)

    def machine_index(self, name: str) -> int:
        try:
            return self._machine_index[name.lower()]
        except KeyError:
            raise TagInputError("machine", f"unknown machine {name!r}; known: {', '.join(m.name for m in self.machines)}") from None

    def bandwidth_gbps(self, machine_a: int, machine_b: int) -> float:
        """Gbit/s between two machines (by index): intra if the same, else the link override or inter; across
        racks the uplinks' lone-flow figure (`pair_gbps`, vectorised)."""
        if machine_a == machine_b:
            return float(self.machines[machine_a].intra_gbps)
        if self.racks and self.hierarchy.level(machine_a, machine_b) > LEVEL_RACK:
            return float(self.pair_gbps(machine_a, machine_b))
        return self._link_gbps.get((machine_a, machine_b), float(self.inter_gbps))

    @cached_property
    def _machine_matrix(self) -> np.ndarray:
        n = len(self.machines)
        mat = np.full((n, n), float(self.inter_gbps))
        for (ia, ib), gbps in self._link_gbps.items():
            mat[ia, ib] = gbps
        np.fill_diagonal(mat, [float(m.intra_gbps) for m in self.machines])
        if self.racks:  # across racks: the uplinks' lone-flow figures
            rack = self.hierarchy.machine_rack
            for r in range(self.hierarchy.num_racks):
                inside = rack == r
                mat[np.ix_(inside, ~inside)] = self.pair_gbps(np.flatnonzero(inside)[:, None], np.flatnonzero(~inside)[None, :])
        mat.flags.writeable = False
        return mat

    def machine_bandwidth_matrix(self) -> np.ndarray:
        """M x M Gbit/s, diagonal = intra; across racks the uplink's lone-flow figure (`pair_gbps`). Cached and
        read-only: copy before editing. M^2 floats: at thousands of machines use `pair_gbps` on the pairs needed."""
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
                    **({"rack": m.rack} if m.rack is not None else {}),
                }
                for m in self.machines
            ],
            "inter_gbps": float(self.inter_gbps),
        }
        if self.links:
            out["links"] = [{"a": a, "b": b, "gbps": float(g)} for a, b, g in self.links]
        if self.racks:  # absent from flat topologies: their hashes stay as they were
            out["racks"] = [{"name": r.name, **({"pod": r.pod} if r.pod is not None else {})} for r in self.racks]
            out["uplinks"] = {"rack": self.rack_uplink.to_dict()}
            if self.pod_uplink is not None:
                out["uplinks"]["pod"] = self.pod_uplink.to_dict()
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


# ---------------------------------------------------------------- random topologies

# Pool for random clusters: the generations the TAG paper's experiments mixed.
RANDOM_GPU_POOL: tuple[str, ...] = ("V100-16GB", "P100-16GB", "GTX1080Ti", "T4", "A100-40GB")
RANDOM_MACHINES = (1, 6)
RANDOM_GPUS_PER_MACHINE = (1, 8)
RANDOM_INTRA_GBPS = (64.0, 160.0)
RANDOM_INTER_GBPS = (20.0, 50.0)


def random_topology(seed: int) -> Topology:
    """A cluster from the TAG paper's distribution, deterministic for `seed` (clusters of a given size, in
    racks: `random_cluster.sized_topology`).

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
