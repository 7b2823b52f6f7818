"""Machine classes: identical machines the planner may treat as one kind.

Two machines are in one class when they have the same GPU type and count, the same intra-machine
bandwidth, the same place in the hierarchy's bandwidth classes (on racks: as many machines in their
rack and in their pod, behind the same uplinks; see `_positions`) and the same link overrides to the
rest (the multiset of their `links`).
The planner chooses "k machines of class c" instead of one mask bit per machine, so its cost grows
with the number of classes, not of machines; `choose_machines` turns k back into concrete machines.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from .topology import Topology


@dataclass(frozen=True)
class MachineClass:
    key: tuple  # what its machines share
    machines: tuple[int, ...]  # machine indices, in choice order (packed by rack, then machine order)

    @property
    def size(self) -> int:
        return len(self.machines)

    @property
    def gpu(self) -> str:
        return str(self.key[0])

    @property
    def count(self) -> int:
        return int(self.key[1])


def rack_of(machine: object) -> object | None:
    """The machine's rack (None on flat topologies)."""
    return getattr(machine, "rack", None)


def _positions(topology: Topology) -> list[tuple | None]:
    """Each machine's bandwidth class in the hierarchy (None on flat topologies). A flow leaving a rack of n
    machines gets gbps * min(1, n / (o * k)) of its uplink, and a pod's likewise with the pod's machines, so
    the sizes of the machine's rack and pod and the uplinks' figures set what its traffic costs. The names
    do not: racks of one size behind the same uplinks are alike (one class, which `choose_machines` packs)."""
    h = topology.hierarchy
    if not h.hierarchical:
        return [None] * topology.num_machines
    rack_size = h.rack_machines[h.machine_rack].tolist()
    pod_size = h.pod_machines[h.machine_pod].tolist()
    return [(int(r), int(p), h.rack_uplink, h.pod_uplink) for r, p in zip(rack_size, pod_size)]


def machine_classes(topology: Topology) -> list[MachineClass]:
    """Classes in order of their first machine; machines of a class ordered for `choose_machines`."""
    links: dict[int, Counter] = {}
    for a, b, gbps in topology.links:
        for name in (a, b):
            links.setdefault(topology.machine_index(name), Counter())[float(gbps)] += 1
    positions = _positions(topology)
    groups: dict[tuple, list[int]] = {}
    for i, m in enumerate(topology.machines):
        key = (m.gpu.name, int(m.count), float(m.intra_gbps), positions[i],
               tuple(sorted(links.get(i, Counter()).items())))
        groups.setdefault(key, []).append(i)
    return [MachineClass(key, tuple(_packed(topology, members))) for key, members in groups.items()]


def _packed(topology: Topology, members: list[int]) -> list[int]:
    """Members ordered so that any prefix is packed into as few racks as possible: the fullest racks first
    (ties by first machine), machine order inside a rack. Without racks: machine order."""
    racks: dict[object, list[int]] = {}
    for i in members:
        racks.setdefault(rack_of(topology.machines[i]), []).append(i)
    if len(racks) == 1:
        return sorted(members)
    ordered = sorted(racks.values(), key=lambda ms: (-len(ms), min(ms)))
    return [i for ms in ordered for i in sorted(ms)]


def choose_machines(cls: MachineClass, k: int) -> tuple[int, ...]:
    """The k machines of `cls` a plan names: deterministic, packed by rack."""
    if not 1 <= k <= cls.size:
        raise ValueError(f"k must lie in [1, {cls.size}], got {k}")
    return cls.machines[:k]


def class_mask(topology: Topology, counts: dict[int, int], classes: list[MachineClass] | None = None) -> np.ndarray:
    """Machine mask for {class index: machines used} (see `choose_machines`)."""
    classes = classes if classes is not None else machine_classes(topology)
    mask = np.zeros(topology.num_machines, dtype=bool)
    for c, k in counts.items():
        if k > 0:
            mask[list(choose_machines(classes[c], k))] = True
    return mask


def machine_class_of(topology: Topology, classes: list[MachineClass] | None = None) -> np.ndarray:
    """Class index of every machine."""
    classes = classes if classes is not None else machine_classes(topology)
    out = np.empty(topology.num_machines, dtype=np.int64)
    for c, cls in enumerate(classes):
        out[list(cls.machines)] = c
    return out
