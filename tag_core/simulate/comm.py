"""What moving bytes costs in the simulator: today's defaults, or the terms a calibration measured.

Uncalibrated, every transfer and every collective step costs `LATENCY_S` (the TAG authors' GPU
figure) and bytes move at the topology's bandwidths. A calibration (tag_core.cluster.calibration)
brings, per link class ("intra": devices of one machine, "inter": across machines), the latency and
bandwidth it fitted to point-to-point transfers; whole-collective fits for the group sizes it
measured, used as they are when a collective is one of those; and the runtime's cost of launching
a step by the number of tasks it touches, added once per iteration (simulate/feeds.py), with the
batch the client feeds through task 0. Collectives it did not measure keep the ring formulas of
tag_core.simulate.cost, with the calibrated latencies.

On a topology with racks (tag_core.cluster.hierarchy), a calibration's "inter" class is the in-rack
level; across racks the uplinks' figures and latencies apply (`level_latency_s`, `pair_terms`), and
an all-reduce goes by `allreduce_tiers`: rings inside machines, inside racks, across racks, across
pods, each rack's uplink shared by the flows that leave it at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tag_core.cluster.calibration import Calibration, Fit
from tag_core.cluster.hierarchy import LEVEL_MACHINE, LEVEL_RACK
from tag_core.cluster.topology import Topology

from .cost import (
    LATENCY_S,
    RingTier,
    broadcast_time,
    bytes_per_s,
    hierarchical_allgather_time,
    hierarchical_allreduce_time,
    tiered_allreduce_time,
)


@dataclass(frozen=True)
class CommModel:
    intra_latency_s: float = LATENCY_S
    inter_latency_s: float = LATENCY_S
    per_step_s: float = 0.0  # launching a step that touches every task
    step_s_by_tasks: dict[int, float] = field(default_factory=dict)  # measured launch cost by tasks touched
    link_gbps: dict[str, float] = field(default_factory=dict)  # link class -> measured bandwidth
    fits: dict[tuple[str, str, int], Fit] = field(default_factory=dict)  # (kind, link, group size)
    calibration_hash: str | None = None
    client_feeds: bool = False  # charge the batch the client feeds (simulate/feeds.py)
    feed_fit: Fit | None = None  # the client's feed to task 0, when the calibration measured it
    compute_overlap: float = 1.0  # share of communication that compute hides (simulate/comm_cpu.py)
    transfer_gap_s: float | None = None  # a link's time between independent transfers (None: their whole time)
    busy_send_s: float = 0.0  # how long a step's compute, just begun, holds what its task sends (comm_loop.py)

    @classmethod
    def from_calibration(cls, calibration: Calibration) -> CommModel:
        fits = {(kind, link, size): fit for kind, by_link in calibration.collectives.items()
                for link, sizes in by_link.items() for size, fit in sizes.items()}
        latency = {link: fit.latency_s for link, fit in calibration.links.items()}
        steps: dict[int, list[float]] = {}
        for sample in calibration.samples:
            if sample.kind == "step" and sample.group_size:
                steps.setdefault(sample.group_size, []).append(sample.seconds)
        return cls(intra_latency_s=latency.get("intra", LATENCY_S), inter_latency_s=latency.get("inter", LATENCY_S),
                   per_step_s=calibration.overheads.per_step_s,
                   step_s_by_tasks={tasks: float(np.median(times)) for tasks, times in steps.items()},
                   link_gbps={link: fit.gbps for link, fit in calibration.links.items()}, fits=fits,
                   calibration_hash=calibration.calibration_hash, client_feeds=True,
                   feed_fit=calibration.links.get("client"),
                   compute_overlap=1.0 if calibration.overheads.compute_overlap is None
                   else calibration.overheads.compute_overlap,
                   transfer_gap_s=calibration.overheads.transfer_gap_s,
                   busy_send_s=calibration.overheads.busy_send_s or 0.0)

    @property
    def calibrated(self) -> bool:
        return self.calibration_hash is not None

    def step_cost(self, tasks: int) -> float:
        """Launching a step that touches `tasks` tasks: measured for that many when the calibration has it
        (a one-task step costs less than a step every task joins), else for the nearest fewer, else per_step_s."""
        fewer = [k for k in self.step_s_by_tasks if k <= tasks]
        return self.step_s_by_tasks[max(fewer)] if fewer else self.per_step_s

    def machine_bandwidth(self, topology: Topology) -> np.ndarray:
        """The topology's machine-by-machine Gbit/s, with each measured link class in place of its figures."""
        matrix = np.array(topology.machine_bandwidth_matrix(), dtype=np.float64)
        diagonal = np.eye(len(matrix), dtype=bool)
        if "intra" in self.link_gbps:  # (the client's link feeds task 0 only: simulate/feeds.py)
            matrix[diagonal] = self.link_gbps["intra"]
        if "inter" in self.link_gbps:  # measured between machines of one rack: every pair of a flat topology
            rack = np.asarray(topology.hierarchy.machine_rack)
            matrix[~diagonal & (rack[:, None] == rack[None, :])] = self.link_gbps["inter"]
        return matrix

    # -- the path of a flow, vectorised over machine pairs (nothing M x M) --

    def level_latency_s(self, topology: Topology) -> np.ndarray:
        """Latency per transfer or ring step by level (index: hierarchy.LEVEL_*): in a machine, in a rack,
        across racks, across pods. An uplink without its own latency_us takes the level below's."""
        rack_us, pod_us = topology.hierarchy.uplink_latency_us()
        across_racks = self.inter_latency_s if rack_us is None else rack_us * 1e-6
        return np.array([self.intra_latency_s, self.inter_latency_s, across_racks,
                         across_racks if pod_us is None else pod_us * 1e-6])

    def pair_terms(self, topology: Topology, a, b) -> tuple[np.ndarray, np.ndarray]:
        """(Gbit/s, latency in s) of a lone flow between machines a and b (index arrays, broadcast): the
        topology's figures by level, with the calibration's measured classes in place in a machine and a rack.
        A transfer of n bytes costs latency + n / bytes_per_s(gbps) (cost.transfer_time)."""
        level = topology.pair_level(a, b)
        gbps = topology.pair_gbps(a, b)
        if "intra" in self.link_gbps:
            gbps = np.where(level == LEVEL_MACHINE, self.link_gbps["intra"], gbps)
        if "inter" in self.link_gbps:
            gbps = np.where(level == LEVEL_RACK, self.link_gbps["inter"], gbps)
        return gbps, self.level_latency_s(topology)[level]

    def ring_gbps(self, topology: Topology, machines) -> float:
        """The slowest hop of one ring through these machines, rack by rack (one hop leaves each rack, so
        no uplink is shared): the `inter_gbps` to give `allgather` and `broadcast` on a topology with racks."""
        ring = _by_rack(topology, machines)
        if len(ring) < 2:
            return 1.0
        gbps, _ = self.pair_terms(topology, ring, np.roll(ring, -1))
        return float(gbps.min())

    def allreduce_tiers(self, topology: Topology, machines) -> tuple[RingTier, ...]:
        """The stages above the machine of a hierarchical all-reduce over these machines (indices; each GPU
        count is the caller's `per_machine`): rings inside racks, then across the racks of each pod, then
        across pods. Per rack r with m_r machines taking part out of n_r, each of its m_r flows across the
        uplink gets rack.flow_gbps(n_r, m_r) = gbps * min(1, n_r / (o * m_r)), carrying B / m_r; across pods
        a machine's flow takes the smaller of its rack's and its pod's shares and carries B / (m_r * racks of
        its pod taking part). Flat topologies: one tier, the ring across machines of `hierarchical_allreduce_time`."""
        ring = _by_rack(topology, machines)
        h = topology.hierarchy
        latency = self.level_latency_s(topology)
        rack = np.asarray(h.machine_rack)[ring]
        racks, starts, taking = np.unique(rack, return_index=True, return_counts=True)
        # Rack tier: each rack's own ring; its hops are in-rack pairs (links, inter_gbps, the calibration).
        following = np.arange(len(ring)) + 1
        following[starts + taking - 1] = starts  # the last machine of a rack passes to its first
        hop_gbps, _ = self.pair_terms(topology, ring, ring[following])
        slowest = np.minimum.reduceat(hop_gbps, starts)
        tiers = [RingTier("rack", taking, 1.0 / bytes_per_s(slowest), float(latency[LEVEL_RACK]), taking)]
        if len(racks) < 2:
            return tuple(tiers)
        rack_share = h.rack_uplink.flow_gbps(h.rack_machines[racks], taking)
        pod = np.asarray(h.rack_pod)[racks]
        pods, pod_of, racks_in_pod = np.unique(pod, return_inverse=True, return_counts=True)
        rack_s = (1.0 / taking) / bytes_per_s(rack_share)  # per rack: its shard over its share
        tiers.append(RingTier("pod", racks_in_pod, _max_by(rack_s, pod_of, len(pods)), float(latency[2]),
                              np.bincount(pod_of, weights=taking).astype(np.int64)))
        if len(pods) < 2:
            return tuple(tiers)
        flows = np.bincount(pod_of, weights=taking)  # machines of each pod that send across its uplink at once
        share = np.minimum(rack_share, h.pod_uplink.flow_gbps(h.pod_machines[pods], flows)[pod_of])
        cluster_s = (1.0 / (taking * racks_in_pod[pod_of])) / bytes_per_s(share)
        tiers.append(RingTier("cluster", np.array([len(pods)]), np.array([cluster_s.max()]), float(latency[3]),
                              np.array([int(flows.sum())])))
        return tuple(tiers)

    def allreduce(self, nbytes, per_machine: list[int], intra_gbps: list[float], inter_gbps: float,
                  tiers: tuple[RingTier, ...] | None = None):
        """All-reduce over devices on machines with `per_machine` GPUs each. With `tiers` (allreduce_tiers of
        the same machines), by `tiered_allreduce_time`; else the two-level ring at `inter_gbps`.
        A measured fit applies within one rack only: the calibration measured no uplink."""
        fit = self._fit("allreduce", per_machine) if tiers is None or len(tiers) < 2 else None
        if fit is not None:
            return fit.latency_s + nbytes / bytes_per_s(fit.gbps)
        if tiers is not None:
            return tiered_allreduce_time(nbytes, per_machine, intra_gbps, tiers, self.intra_latency_s)
        return hierarchical_allreduce_time(nbytes, per_machine, intra_gbps, inter_gbps, self.intra_latency_s,
                                           self.inter_latency_s)

    def allgather(self, total_bytes, shares, per_machine: list[int], intra_gbps: list[float], inter_gbps: float):
        return hierarchical_allgather_time(total_bytes, shares, per_machine, intra_gbps, inter_gbps,
                                           self.intra_latency_s, self.inter_latency_s)

    def broadcast(self, nbytes, per_machine: list[int], gbps: float):
        fit = self._fit("broadcast", per_machine)
        if fit is not None:
            return fit.latency_s + nbytes / bytes_per_s(fit.gbps)
        latency = self.inter_latency_s if len(per_machine) > 1 else self.intra_latency_s
        return broadcast_time(nbytes, sum(per_machine), gbps, latency)

    def _fit(self, kind: str, per_machine: list[int]) -> Fit | None:
        """The measured fit of a collective over these devices: all on one machine, or one per machine."""
        if not self.fits:
            return None
        if len(per_machine) == 1:
            return self.fits.get((kind, "intra", per_machine[0]))
        if all(count == 1 for count in per_machine):
            return self.fits.get((kind, "inter", len(per_machine)))
        return None


def _by_rack(topology: Topology, machines) -> np.ndarray:
    """Distinct machine indices, rack by rack (machine order inside a rack): a ring's or the tiers' order."""
    ring = np.unique(np.asarray(machines, dtype=np.int64))
    return ring[np.argsort(np.asarray(topology.hierarchy.machine_rack)[ring], kind="stable")]


def _max_by(values: np.ndarray, group: np.ndarray, groups: int) -> np.ndarray:
    out = np.full(groups, -np.inf)
    np.maximum.at(out, group, values)
    return out


def comm_for(conn, topology: Topology) -> tuple[CommModel, str | None]:
    """The communication model for this snapshot of `topology`, and why it is uncalibrated (None when a
    calibration applies): the newest calibration made for this very snapshot. One made for another snapshot
    of the same name is not applied: both hashes are named."""
    from tag_core import store
    from tag_core.cluster.calibration import load_from_store

    calibrations = store.list_calibrations(conn)
    mine = calibrations[calibrations.topology == topology.name]
    if mine.empty:
        return CommModel(), (f"no calibration of {topology.name} in the store (`tag calibrate`): the cost model's "
                             f"defaults, {LATENCY_S * 1e6:g} µs per transfer and the topology's bandwidths")
    current = mine[mine.topology_hash == topology.content_hash()]
    if current.empty:
        newest = mine.iloc[0]
        return CommModel(), (f"calibration {newest.calibration_hash} of {topology.name} was made for snapshot "
                             f"{newest.topology_hash}, not this one ({topology.content_hash()}): not applied; "
                             "calibrate this snapshot")
    calibration = load_from_store(conn, calibration_hash=current.iloc[0].calibration_hash)
    return CommModel.from_calibration(calibration), None
