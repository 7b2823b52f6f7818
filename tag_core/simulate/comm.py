"""What moving bytes costs in the simulator: today's defaults, or the terms a calibration measured.

Uncalibrated, every transfer and every collective step costs `LATENCY_S` (the TAG authors' GPU
figure) and bytes move at the topology's bandwidths. A calibration (tag_core.cluster.calibration)
brings, per link class ("intra": devices of one machine, "inter": across machines), the latency and
bandwidth it fitted to point-to-point transfers; whole-collective fits for the group sizes it
measured, used as they are when a collective is one of those; and the runtime's cost of launching
a step by the number of tasks it touches, added once per iteration (simulate/feeds.py), with the
batch the client feeds through task 0. Collectives it did not measure keep the ring formulas of
tag_core.simulate.cost, with the calibrated latencies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tag_core.cluster.calibration import Calibration, Fit
from tag_core.cluster.topology import Topology

from .cost import LATENCY_S, broadcast_time, bytes_per_s, hierarchical_allgather_time, hierarchical_allreduce_time


@dataclass(frozen=True)
class CommModel:
    intra_latency_s: float = LATENCY_S
    inter_latency_s: float = LATENCY_S
    per_step_s: float = 0.0  # launching a step that touches every task
    step_s_by_tasks: dict[int, float] = field(default_factory=dict)  # measured launch cost by tasks touched
    link_gbps: dict[str, float] = field(default_factory=dict)  # link class -> measured bandwidth
    fits: dict[tuple[str, str, int], Fit] = field(default_factory=dict)  # (kind, link, group size)
    calibration_hash: str | None = None
    client_feeds: bool = False  # charge the batch the client feeds through task 0 (simulate/feeds.py)
    feed_fit: Fit | None = None  # the client's feed to task 0, when the calibration measured it

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
                   feed_fit=calibration.links.get("client"))

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
        if "inter" in self.link_gbps:
            matrix[~diagonal] = self.link_gbps["inter"]
        return matrix

    def allreduce(self, nbytes, per_machine: list[int], intra_gbps: list[float], inter_gbps: float):
        fit = self._fit("allreduce", per_machine)
        if fit is not None:
            return fit.latency_s + nbytes / bytes_per_s(fit.gbps)
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
