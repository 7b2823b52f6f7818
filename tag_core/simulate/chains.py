"""Every slot's chain of ops, with durations and cumulative durations, built by compiled passes.

A slot runs the ops it holds in the global priority order; each op takes its time on the slot's GPU at the
batch it processes (the slot's share of the batch for a split op, the whole batch otherwise). Plans with
model-parallel parts or parameter servers on hundreds of devices have hundreds of slots of tens of
thousands of ops, and most of those slots differ only in their few single-device ops: the shared part is
listed once per template, and each slot's chain merges it with its own (in threads: parallel.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from .parallel import over_slots
from .units import SINGLE, SPLIT


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


def build_chains(ctx, p, s, slots, order: np.ndarray, pos: np.ndarray, cidx: np.ndarray) -> Chains:
    """Fills `cidx[k, op]` with the op's position in slot k's chain (`pos`: each op's place in `order`). A slot
    runs its groups' ops that are not single-device, and the single-device ops on its device."""
    S, G = len(slots.dev), s.num_groups
    # One time table per distinct (GPU type, batch): a slot's split ops use its share of their group's batch.
    gpu = ctx.dev_gpu_id[slots.dev]
    active = np.ascontiguousarray(p.group_active[:, slots.dev].T)  # (S, G)
    # (S, G); a group the slot is not in reads the full-batch table (never used: batch 0 would cost a table)
    split_batch = np.where(active, ctx.batch * p.group_share[:, slots.dev].T, float(ctx.batch))
    keys = np.concatenate([np.column_stack([np.repeat(gpu, G), split_batch.ravel()]),
                           np.column_stack([gpu, np.full(S, float(ctx.batch))])])
    distinct, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    owner = np.concatenate([np.repeat(slots.dev, G), slots.dev])[first]  # a device of each table's GPU type
    tables = np.stack([ctx.compute.times(ctx.dev_gpu[int(d)], float(b)) for d, b in zip(owner, distinct[:, 1])])
    table_split = inverse[:S * G].reshape(S, G).astype(np.int64)
    table_full = inverse[S * G:].astype(np.int64)
    # Slots in the same groups with the same tables share their chain but for their single-device ops (PS
    # updates, model-parallel parts): the shared part is listed once per such template, then merged.
    _, template_slot, template_of = np.unique(np.column_stack([active, table_split, table_full]), axis=0,
                                              return_index=True, return_inverse=True)
    single = p.kind == SINGLE
    single_ops = np.flatnonzero(single)
    single_slot = slots.of_dev[p.single_dev[single_ops]]
    by = np.lexsort((pos[single_ops], single_slot))
    single_ops = single_ops[by]
    single_ptr = np.concatenate([[0], np.cumsum(np.bincount(single_slot, minlength=S))]).astype(np.int64)
    t_base, t_ops = _templates(order.astype(np.int64), single, s.op_groups, template_slot.astype(np.int64), active)
    template_of = template_of.reshape(-1).astype(np.int64)
    lens = np.diff(t_base)[template_of] + np.diff(single_ptr)
    base = (np.cumsum(lens) - lens).astype(np.int64)
    total = int(lens.sum())
    ops, table = np.empty(total, dtype=np.int32), np.empty(total, dtype=np.int32)
    dur, cum = np.empty(total), np.empty(total)
    over_slots(_merge, lens, template_of, t_base, t_ops, single_ops, single_ptr, pos, p.kind == SPLIT, s.op_groups,
               table_split, table_full, tables, base, ops, table, dur, cum, cidx)
    return Chains(base, lens, ops, dur, cum, table, distinct[:, 1].copy())


@njit(cache=True, nogil=True)
def _templates(order, single, group, template_slot, active):
    """Each template's ops that are not single-device, in execution order (flat, from t_base[t])."""
    T = len(template_slot)
    t_base = np.zeros(T + 1, dtype=np.int64)
    for t in range(T):
        k = template_slot[t]
        t_base[t + 1] = t_base[t]
        for op in order:
            if not single[op] and active[k, group[op]]:
                t_base[t + 1] += 1
    t_ops = np.empty(t_base[T], dtype=np.int64)
    for t in range(T):
        k, w = template_slot[t], t_base[t]
        for op in order:
            if not single[op] and active[k, group[op]]:
                t_ops[w] = op
                w += 1
    return t_base, t_ops


@njit(cache=True, nogil=True)
def _merge(first, stop, template_of, t_base, t_ops, single_ops, single_ptr, pos, split, group, table_split, table_full,
           tables, base, ops, table, dur, cum, cidx):
    """Slots first..stop-1: the template's ops and the slot's single-device ops, merged in execution order."""
    for k in range(first, stop):
        a, a_end = t_base[template_of[k]], t_base[template_of[k] + 1]
        j, j_end = single_ptr[k], single_ptr[k + 1]
        w, running = base[k], 0.0
        while a < a_end or j < j_end:
            if j >= j_end or (a < a_end and pos[t_ops[a]] < pos[single_ops[j]]):
                op = t_ops[a]
                a += 1
                t = table_split[k, group[op]] if split[op] else table_full[k]
            else:
                op = single_ops[j]
                j += 1
                t = table_full[k]
            ops[w], table[w], dur[w] = op, t, tables[t, op]
            running += dur[w]  # as np.cumsum adds: in order
            cum[w] = running
            cidx[k, op] = w - base[k]
            w += 1
