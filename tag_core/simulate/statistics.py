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

from .expand import _allreduce_shape, _no_collectives, _tiers
from .units import ALLREDUCE, SPLIT, Collectives, Placement


def statistic_collectives(ctx, p: Placement, s) -> Collectives:
    ops = ctx.statistics
    if not len(ops):
        return _no_collectives()
    groups = s.op_groups[ops]
    replicated = (p.kind[ops] == SPLIT) & (p.group_active[groups].sum(axis=1) > 1)
    kinds, nbytes, durations, channels, devices, inp, cons_op, cons_unit = [], [], [], [], [], [], [], []
    for op, g in zip(ops[replicated].tolist(), groups[replicated].tolist()):
        out = ctx.e_dst[ctx.e_src == op]
        readers = np.unique(out[p.pl[out] == p.pl[op]])  # other placements get it by edge_transfers
        if not len(readers):
            continue
        devs = np.flatnonzero(p.group_active[g])
        counts, intra, inter, used = _allreduce_shape(ctx, devs)
        size = np.array([float(ctx.act_bytes[op])])
        durations.append(float(ctx.comm.allreduce(size, counts, intra, inter, **_tiers(ctx, devs))[0]))
        unit = len(kinds)
        kinds.append(ALLREDUCE), nbytes.append(size[0]), channels.append(used), devices.append(devs), inp.append(op)
        cons_op.append(readers), cons_unit.append(np.full(len(readers), unit))
    if not kinds:
        return _no_collectives()
    return Collectives(np.array(kinds, dtype=np.int64), np.array(nbytes), np.array(durations), channels, devices,
                       np.array(inp, dtype=np.int64), np.arange(len(kinds), dtype=np.int64),
                       np.concatenate(cons_op).astype(np.int64), np.concatenate(cons_unit).astype(np.int64),
                       statistic=np.ones(len(kinds), dtype=bool))
