"""Racks and pods: the levels of a topology above the machine, and what a flow meets crossing them.

A machine may name its rack; racks may name their pod. The level of a machine pair is the smallest
unit that holds both: LEVEL_MACHINE (the same machine), LEVEL_RACK (machines of one rack: the
machines' NICs and the rack switch, `inter_gbps` and `links`), LEVEL_POD (racks of one pod: the
flow leaves its rack by the rack's uplink) and LEVEL_CLUSTER (pods: the rack's uplink, then the
pod's). A flat topology is one rack in one pod, so its pairs are LEVEL_MACHINE or LEVEL_RACK.

Oversubscription (o >= 1) is the ratio of what a unit's machines can send to what its uplink
carries. A unit of n machines whose uplink gives one flow `gbps` has capacity n * gbps / o, so k
flows leaving it at once each get

    gbps * min(1, n / (o * k))

which is gbps / o when every machine of the unit sends (k = n), and gbps for a lone flow when
n >= o. Everything here is vectorised over machine indices: nothing is M x M.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .fields import bounded_number, require

LEVEL_MACHINE, LEVEL_RACK, LEVEL_POD, LEVEL_CLUSTER = 0, 1, 2, 3
LEVEL_NAMES = ("machine", "rack", "pod", "cluster")


@dataclass(frozen=True)
class Rack:
    name: str
    pod: str | None = None  # None: every rack in one pod


@dataclass(frozen=True)
class Uplink:
    """The link out of a rack (to the other racks of its pod) or out of a pod (to the other pods)."""

    gbps: float  # what one flow gets across it when it crosses alone
    oversubscription: float = 1.0  # the unit's machines' demand / the uplink's capacity, >= 1
    latency_us: float | None = None  # per transfer or ring step across it; None: the level below's

    def check(self, where: str) -> None:
        bounded_number(self.gbps, f"{where}.gbps", "gbps")
        bounded_number(self.oversubscription, f"{where}.oversubscription", "oversubscription")
        if self.latency_us is not None:
            bounded_number(self.latency_us, f"{where}.latency_us", "latency_us")

    def flow_gbps(self, members, flows) -> np.ndarray:
        """Gbit/s each of `flows` concurrent flows gets out of a unit of `members` machines (arrays broadcast)."""
        members = np.asarray(members, dtype=np.float64)
        flows = np.maximum(np.asarray(flows, dtype=np.float64), 1.0)
        return self.gbps * np.minimum(1.0, members / (self.oversubscription * flows))

    def to_dict(self) -> dict:
        out = {"gbps": float(self.gbps), "oversubscription": float(self.oversubscription)}
        if self.latency_us is not None:
            out["latency_us"] = float(self.latency_us)
        return out


def check_hierarchy(machine_racks: list[str | None], racks: tuple[Rack, ...], rack_uplink: Uplink | None,
                    pod_uplink: Uplink | None) -> None:
    """Racks are all or nothing: every machine names a listed rack, every listed rack holds a machine;
    pods likewise for racks; each level in use has its uplink. Errors name the field."""
    named = [i for i, rack in enumerate(machine_racks) if rack is not None]
    if not named:
        require(not racks, "racks", "lists racks but no machine names one (machines[].rack)")
        require(rack_uplink is None, "uplinks.rack", "needs racks: give machines[].rack and racks")
        require(pod_uplink is None, "uplinks.pod", "needs racks with pods: give racks[].pod")
        return
    first = named[0]
    if len(named) < len(machine_racks):
        missing = next(i for i, rack in enumerate(machine_racks) if rack is None)
        require(False, f"machines[{missing}].rack",
                f"missing: every machine names its rack when one does (machines[{first}] is in {machine_racks[first]!r})")
    require(len(racks) > 0, "racks", "missing required field: machines name racks, so list them")
    index: dict[str, int] = {}
    for j, rack in enumerate(racks):
        require(isinstance(rack.name, str) and rack.name.strip() != "", f"racks[{j}].name", "must be a non-empty string")
        key = rack.name.lower()
        require(key not in index, f"racks[{j}].name", f"duplicate rack name {rack.name!r} (also racks[{index.get(key)}])")
        index[key] = j
    used = set()
    for i, rack_name in enumerate(machine_racks):
        j = index.get(str(rack_name).lower())
        if j is None:
            known = ", ".join(r.name for r in racks[:20]) + (", ..." if len(racks) > 20 else "")
            require(False, f"machines[{i}].rack", f"unknown rack {rack_name!r}; known: {known}")
        used.add(j)
    for j, rack in enumerate(racks):
        require(j in used, f"racks[{j}]", f"no machine is in rack {rack.name!r}")
    require(rack_uplink is not None, "uplinks.rack", "missing required field: racks need their uplink's figures")
    rack_uplink.check("uplinks.rack")
    pods = [j for j, rack in enumerate(racks) if rack.pod is not None]
    if not pods:
        require(pod_uplink is None, "uplinks.pod", "needs pods: give every rack its racks[].pod")
        return
    if len(pods) < len(racks):
        missing = next(j for j, rack in enumerate(racks) if rack.pod is None)
        require(False, f"racks[{missing}].pod",
                f"missing: every rack names its pod when one does (racks[{pods[0]}] is in {racks[pods[0]].pod!r})")
    for j in pods:
        pod = racks[j].pod
        require(isinstance(pod, str) and pod.strip() != "", f"racks[{j}].pod", "must be a non-empty string")
    require(pod_uplink is not None, "uplinks.pod", "missing required field: pods need their uplink's figures")
    pod_uplink.check("uplinks.pod")


@dataclass(frozen=True, eq=False)  # arrays: compared and hashed by identity; topologies compare by their fields
class Hierarchy:
    """Index arrays of a topology's racks and pods (read-only), and level queries over machine indices."""

    machine_rack: np.ndarray  # (M,) rack index of each machine; a flat topology: all 0
    rack_pod: np.ndarray  # (R,) pod index of each rack
    rack_names: tuple[str, ...]
    pod_names: tuple[str, ...]
    rack_uplink: Uplink | None
    pod_uplink: Uplink | None

    @classmethod
    def build(cls, machine_racks: list[str | None], racks: tuple, rack_uplink, pod_uplink) -> Hierarchy:
        if not racks:
            return cls(_frozen(np.zeros(len(machine_racks), dtype=np.int32)), _frozen(np.zeros(1, dtype=np.int32)),
                       (), (), None, None)
        rack_index = {r.name.lower(): j for j, r in enumerate(racks)}
        pods: dict[str, int] = {}
        rack_pod = [pods.setdefault((r.pod or "").lower(), len(pods)) for r in racks]
        pod_names: dict[int, str] = {}
        for r, p in zip(racks, rack_pod):
            pod_names.setdefault(p, r.pod or "")
        return cls(_frozen(np.array([rack_index[str(name).lower()] for name in machine_racks], dtype=np.int32)),
                   _frozen(np.array(rack_pod, dtype=np.int32)), tuple(r.name for r in racks),
                   tuple(pod_names[p] for p in range(len(pods))) if racks[0].pod is not None else (),
                   rack_uplink, pod_uplink)

    @property
    def hierarchical(self) -> bool:
        return self.rack_uplink is not None

    @property
    def num_racks(self) -> int:
        return len(self.rack_pod)

    @property
    def num_pods(self) -> int:
        return int(self.rack_pod.max()) + 1

    @property
    def machine_pod(self) -> np.ndarray:
        return self.rack_pod[self.machine_rack]

    @property
    def rack_machines(self) -> np.ndarray:
        """Machines in each rack: what its uplink's capacity is counted from."""
        return np.bincount(self.machine_rack, minlength=self.num_racks)

    @property
    def pod_machines(self) -> np.ndarray:
        return np.bincount(self.machine_pod, minlength=self.num_pods)

    def uplink_capacity_gbps(self) -> tuple[np.ndarray, np.ndarray]:
        """(per rack, per pod) Gbit/s each uplink carries in all, members * gbps / oversubscription: the
        capacity of one shared channel per uplink, for flows that cross it at the same time."""
        if not self.hierarchical:
            return np.zeros(0), np.zeros(0)
        rack = self.rack_machines * self.rack_uplink.gbps / self.rack_uplink.oversubscription
        if self.pod_uplink is None:
            return rack, np.zeros(0)
        return rack, self.pod_machines * self.pod_uplink.gbps / self.pod_uplink.oversubscription

    def level(self, a, b) -> np.ndarray:
        """The level of each machine pair (arrays broadcast): LEVEL_MACHINE .. LEVEL_CLUSTER, as int8."""
        a, b = np.asarray(a), np.asarray(b)
        if not self.hierarchical:
            return np.where(a == b, LEVEL_MACHINE, LEVEL_RACK).astype(np.int8)
        ra, rb = self.machine_rack[a], self.machine_rack[b]
        across = np.where(self.rack_pod[ra] == self.rack_pod[rb], LEVEL_POD, LEVEL_CLUSTER)
        return np.where(a == b, LEVEL_MACHINE, np.where(ra == rb, LEVEL_RACK, across)).astype(np.int8)

    def uplink_latency_us(self) -> tuple[float | None, float | None]:
        """Latency across racks and across pods (µs), each the level below's when not given (None: in-rack)."""
        rack = self.rack_uplink.latency_us if self.rack_uplink is not None else None
        pod = self.pod_uplink.latency_us if self.pod_uplink is not None else None
        return rack, pod if pod is not None else rack

    def lone_flow_gbps(self, level: int) -> float:
        """One flow alone across racks (LEVEL_POD) or pods (LEVEL_CLUSTER): the slowest uplink it crosses."""
        if level == LEVEL_POD:
            return float(self.rack_uplink.gbps)
        return float(min(self.rack_uplink.gbps, self.pod_uplink.gbps))


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array
