"""All-reduces of batch statistics: what data parallelism adds besides the gradients.

A replica that trains on part of the batch sees part of each batch-wide figure that is not a gradient:
the count a mean loss divides by, a masked loss's normaliser, the backward pass's share of it. The
emitter sums each over the replicas of its group with one small all-reduce (tag_core.emit.transfer,
`_all_reduce` of a partial or a statistic), and the ops that read it wait for it: on the local runtime
each costs a collective's latency, a millisecond or more, in the middle of the step. `Simulator` takes
these ops as `statistics` (tag_core.emit.prediction finds them in an emitted graph); each becomes one
all-reduce unit over its group's devices, which its consumers in the same placement wait for.
"""

from __future__ import annotations

import numpy as np

from .expand import group_allreduces
from .units import ALLREDUCE, SPLIT, Collectives, Placement, no_collectives


def statistic_collectives(ctx, p: Placement, s) -> Collectives:
    ops = ctx.statistics
    groups = s.op_groups[ops]
    replicated = (p.kind[ops] == SPLIT) & (p.group_active[groups].sum(axis=1) > 1)
    units, unit_group, readers = [], [], []  # per unit: the op, its group, the ops that read it in its placement
    for op, g in zip(ops[replicated].tolist(), groups[replicated].tolist()):
        out = ctx.e_dst[ctx.e_src == op]
        mine = np.unique(out[p.pl[out] == p.pl[op]])  # other placements get it by edge_transfers
        if len(mine):
            units.append(op), unit_group.append(g), readers.append(mine)
    if not units:
        return no_collectives()
    U = len(units)
    nbytes = ctx.act_bytes[units].astype(np.float64)
    durations, channels, devices = group_allreduces(ctx, p, np.array(unit_group, dtype=np.int64), nbytes)
    return Collectives(np.full(U, ALLREDUCE), nbytes, durations, channels, devices, np.array(units, dtype=np.int64),
                       np.arange(U), np.concatenate(readers).astype(np.int64),
                       np.repeat(np.arange(U), [len(r) for r in readers]), statistic=np.ones(U, dtype=bool))
