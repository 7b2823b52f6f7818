"""Where each op of the step runs under a Strategy: placements of copies and their sub-batches.

The simulator's `place` is the one reading of a Strategy (which devices a group uses, how
its batch is shared, where model-parallel ops and PS updates go); this module turns it
into integer sub-batches and a small set of distinct placements:

    split   replicas on several devices, replica k computes rows [lo_k, hi_k) of the batch
    full    a copy on every device, each with the whole batch (the "duplicate" option)
    single  one copy on one device, whole batch (model-parallel ops, PS updates, inputs)

A split or full placement on one device is a single one: the computation is the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tag_core.capture.graph import OpGraph
from tag_core.cluster.topology import Topology
from tag_core.simulate.strategy import Strategy

SPLIT, FULL, SINGLE = "split", "full", "single"


@dataclass(frozen=True)
class Placement:
    kind: str  # SPLIT, FULL or SINGLE
    devices: tuple[int, ...]  # topology device indices, one per copy
    batches: tuple[int, ...]  # rows of the global batch each copy computes

    @property
    def replicas(self) -> int:
        return len(self.devices)

    def rows(self, replica: int) -> tuple[int, int]:
        """The rows [lo, hi) of the global batch that copy `replica` holds."""
        if self.kind != SPLIT:
            return 0, self.batches[replica]
        lo = sum(self.batches[:replica])
        return lo, lo + self.batches[replica]

    def weight(self, replica: int) -> float:
        """The copy's share of the global batch: its loss counts this much in the full-batch mean."""
        if self.kind != SPLIT:
            return 1.0
        return self.batches[replica] / sum(self.batches)

    def describe(self, device_names: list[str]) -> str:
        devices = ", ".join(device_names[d] for d in self.devices)
        if self.kind == SPLIT:
            return f"split over {devices} (rows {', '.join(map(str, self.batches))})"
        return f"{self.kind} on {devices}"


@dataclass
class OpPlacements:
    placements: list[Placement]
    op_pid: dict[str, int]  # OpGraph op name -> index into placements
    notes: list[str] = field(default_factory=list)

    def pid_of(self, placement: Placement) -> int:
        """Index of `placement`, added when new."""
        try:
            return self.placements.index(placement)
        except ValueError:
            self.placements.append(placement)
            return len(self.placements) - 1

    def single(self, device: int, batch: int) -> int:
        return self.pid_of(Placement(SINGLE, (device,), (batch,)))


def place_ops(graph: OpGraph, topology: Topology, strategy: Strategy, profiles=None,
              batch_size: int | None = None) -> OpPlacements:
    """Placement of every OpGraph op at `batch_size` (default: the graph's); model inputs become
    single copies fed with the whole batch."""
    from tag_core.simulate.expand import place
    from tag_core.simulate.simulator import Simulator
    from tag_core.simulate.units import FULL as SIM_FULL
    from tag_core.simulate.units import SINGLE as SIM_SINGLE

    strategy.validate(len(graph.ops), topology.num_machines, topology.num_devices)
    sim = Simulator(graph, topology, profiles, batch_size=batch_size)
    p = place(sim, strategy)
    batch = sim.batch
    result = OpPlacements(placements=[], op_pid={})
    group_pids: dict[tuple[int, int], int] = {}
    for i, op in enumerate(graph.ops):
        group = int(strategy.op_groups[i])
        kind = int(p.kind[i])
        if kind == SIM_SINGLE:
            pid = result.single(int(p.single_dev[i]), batch)
        else:
            key = (group, kind)
            if key not in group_pids:
                wanted = int((strategy.masks[group][sim.dev_machine] & (strategy.batch_shares > 0)).sum())
                placement = _group_placement(p, group, kind == SIM_FULL, batch)
                if kind != SIM_FULL and placement.replicas < wanted:
                    result.notes.append(f"group {group}: a batch of {batch} leaves {wanted - placement.replicas} "
                                        f"of its {wanted} devices without rows; they get no replica")
                group_pids[key] = result.pid_of(placement)
            pid = group_pids[key]
        if op.is_input:  # fed once, whole batch, on the first device of its placement
            pid = result.single(result.placements[pid].devices[0], batch)
        result.op_pid[op.name] = pid
    return result


def _group_placement(p, group: int, full: bool, batch: int) -> Placement:
    """The simulator's devices of the group (a split group's hold whole rows: simulate/batch_rows.py)."""
    devices = [int(d) for d in np.flatnonzero(p.group_active[group])]
    if full:
        placement = Placement(FULL, tuple(devices), (batch,) * len(devices))
    else:
        rows = np.rint(p.group_share[group, devices] * batch).astype(np.int64)  # each device's share is rows / batch
        placement = Placement(SPLIT, tuple(devices), tuple(int(r) for r in rows))
    if placement.replicas == 1:
        return Placement(SINGLE, placement.devices, (batch,))
    return placement


def device_names(topology: Topology, kind: str) -> list[str]:
    """TF device string of every topology device: one worker task per machine."""
    label = "GPU" if kind == "gpu" else "CPU"
    return [f"/job:worker/task:{d.machine}/device:{label}:{d.local}" for d in topology.devices]
