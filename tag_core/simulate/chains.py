"""Every slot's chain of ops, with durations and cumulative durations, built in one compiled pass.

A slot runs the ops it holds in the global priority order; each op takes its time on the slot's GPU at the
batch it processes (the slot's share of the batch for a split op, the whole batch otherwise). Plans with
model-parallel parts or parameter servers on hundreds of devices have hundreds of slots of tens of
thousands of ops: a numpy pass per slot cost more than the rest of the schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from .units import SPLIT


@dataclass
class Chains:
    """Slot k's entries are [base[k], base[k] + lens[k]) of the flat arrays, in execution order."""

    base: np.ndarray
    lens: np.ndarray
    ops: np.ndarray  # int32
    dur: np.ndarray
    cum: np.ndarray | None  # running sum of dur within each slot (the schedule turns it into the ends)
    table: np.ndarray  # int32: the time table each entry read, whose batch is batches[table]
    batches: np.ndarray  # samples an op processes, per time table

    def per_slot(self, values: np.ndarray) -> list[np.ndarray]:
        return np.split(values, self.base[1:]) if len(self.base) else []


def build_chains(ctx, p, s, slots, on: np.ndarray, order: np.ndarray, cidx: np.ndarray) -> Chains:
    """Fills `cidx[k, op]` with the op's position in slot k's chain."""
    S, G = len(slots.dev), s.num_groups
    # One time table per distinct (GPU type, batch): a slot's split ops use its share of their group's batch.
    gpu = ctx.dev_gpu_id[slots.dev]
    # (S, G); a group the slot is not in reads the full-batch table (never used: batch 0 would cost a table)
    split_batch = np.where(p.group_active[:, slots.dev].T, ctx.batch * p.group_share[:, slots.dev].T, float(ctx.batch))
    keys = np.concatenate([np.column_stack([np.repeat(gpu, G), split_batch.ravel()]),
                           np.column_stack([gpu, np.full(S, float(ctx.batch))])])
    distinct, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    owner = np.concatenate([np.repeat(slots.dev, G), slots.dev])[first]  # a device of each table's GPU type
    tables = np.stack([ctx.compute.times(ctx.dev_gpu[int(d)], float(b)) for d, b in zip(owner, distinct[:, 1])])
    table_split = inverse[:S * G].reshape(S, G).astype(np.int64)
    table_full = inverse[S * G:].astype(np.int64)
    base, lens, ops, table, dur, cum = _build(order.astype(np.int64), on, p.kind == SPLIT, s.op_groups, table_split,
                                              table_full, tables, cidx)
    return Chains(base, lens, ops, dur, cum, table, distinct[:, 1].copy())


@njit(cache=True, nogil=True)
def _build(order, on, split, group, table_split, table_full, tables, cidx):
    S, n = on.shape[0], len(order)
    lens = np.zeros(S, dtype=np.int64)
    for k in range(S):
        for op in order:
            if on[k, op]:
                lens[k] += 1
    base = np.zeros(S, dtype=np.int64)
    for k in range(1, S):
        base[k] = base[k - 1] + lens[k - 1]
    total = base[S - 1] + lens[S - 1] if S else 0
    ops = np.empty(total, dtype=np.int32)
    table = np.empty(total, dtype=np.int32)
    dur, cum = np.empty(total), np.empty(total)
    for k in range(S):
        w, running = base[k], 0.0
        for i in range(n):
            op = order[i]
            if on[k, op]:
                t = table_split[k, group[op]] if split[op] else table_full[k]
                ops[w], table[w], dur[w] = op, t, tables[t, op]
                running += dur[w]  # as np.cumsum adds: in order
                cum[w] = running
                cidx[k, op] = w - base[k]
                w += 1
    return base, lens, ops, table, dur, cum
