"""The units the simulator schedules: op placements, point-to-point transfers and collectives, as flat arrays.

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
