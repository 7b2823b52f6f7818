"""The units the simulator schedules: op placements, point-to-point transfers and collectives, as flat arrays
(and their empty and joined forms).

expand.py makes them from a Strategy, reshard.py folds big re-slicings into them, engine.py schedules them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

SPLIT, FULL, SINGLE = 0, 1, 2
KINDS = ("p2p", "ps_pull", "ps_push", "gather", "allreduce", "allgather", "broadcast")
P2P, PS_PULL, PS_PUSH, GATHER, ALLREDUCE, ALLGATHER, BROADCAST = range(7)
NORMAL, PUSH, REDUCED = 0, 1, 2  # how an edge's data reaches its consumer


@dataclass
class Placement:
    kind: np.ndarray  # per op: SPLIT / FULL / SINGLE
    pl: np.ndarray  # per op: placement id (group g; G + device for SINGLE; G + D + g for SFB's full copies)
    group_active: np.ndarray  # bool (G, D): devices of each group
    group_share: np.ndarray  # (G, D): batch fraction of each device within its group
    single_dev: np.ndarray  # per op: device of SINGLE ops, else -1
    op_batch_frac: np.ndarray | None = None  # filled per device later


@dataclass
class Transfers:
    """Point-to-point transfers, one row each (vectorised)."""

    cons_op: np.ndarray
    cons_dev: np.ndarray
    src_op: np.ndarray  # -1: available at time 0 (a PS pull)
    src_dev: np.ndarray
    nbytes: np.ndarray
    channel: np.ndarray
    kind: np.ndarray


TRANSFER_FIELDS = tuple(f.name for f in fields(Transfers))


@dataclass
class Collectives:
    """Collective units, as flat arrays: gradient AllReduce (one per tensor, or per fused bucket),
    all-gathers and broadcasts (one per tensor and destination placement)."""

    kind: np.ndarray  # per unit: ALLREDUCE, ALLGATHER or BROADCAST
    nbytes: np.ndarray  # per unit
    duration: np.ndarray  # per unit, seconds
    channels: list[tuple[int, ...]]  # per unit: channels it occupies
    devices: list[np.ndarray]  # per unit: participants
    inp_op: np.ndarray  # gradient ops feeding each unit (flat) ...
    inp_unit: np.ndarray  # ... and their unit
    cons_op: np.ndarray  # ops waiting for each unit (flat) ...
    cons_unit: np.ndarray  # ... and their unit
    statistic: np.ndarray | None = None  # per unit: a batch statistic's all-reduce, not a gradient's (None: none is)

    def __len__(self) -> int:
        return len(self.kind)


def no_collectives() -> Collectives:
    z = np.zeros(0, dtype=np.int64)
    return Collectives(z, np.zeros(0), np.zeros(0), [], [], z, z, z, z)


def no_transfers() -> Transfers:
    z = np.zeros(0, dtype=np.int64)
    return Transfers(z, z, z, z, np.zeros(0), z, z)


def concat_transfers(parts: list[Transfers]) -> Transfers:
    """The parts' transfers in one; the parts are used up (their fields dropped as they are copied: a PS on
    thousands of GPUs has millions of transfers, and two whole copies of them would double the peak)."""
    parts = [t for t in parts if len(t.cons_op)]
    if not parts:
        return no_transfers()
    if len(parts) == 1:
        return parts[0]
    columns = {}
    for f in TRANSFER_FIELDS:
        columns[f] = np.concatenate([getattr(t, f) for t in parts])
        for t in parts:
            setattr(t, f, None)
    return Transfers(**columns)


def concat_collectives(parts: list[Collectives]) -> Collectives:
    parts = [c for c in parts if len(c)]
    if not parts:
        return no_collectives()
    if len(parts) == 1:
        return parts[0]
    offsets = np.cumsum([0] + [len(c) for c in parts[:-1]])
    cat = np.concatenate
    return Collectives(
        cat([c.kind for c in parts]), cat([c.nbytes for c in parts]), cat([c.duration for c in parts]),
        [ch for c in parts for ch in c.channels], [d for c in parts for d in c.devices],
        cat([c.inp_op for c in parts]), cat([c.inp_unit + o for c, o in zip(parts, offsets)]),
        cat([c.cons_op for c in parts]), cat([c.cons_unit + o for c, o in zip(parts, offsets)]),
        None if all(c.statistic is None for c in parts) else
        cat([np.zeros(len(c), dtype=bool) if c.statistic is None else c.statistic for c in parts]),
    )
