"""Per-slot figures from a schedule, vectorised over slots: op start/end/idle, group makespans and peak memory.

A plan that places model-parallel parts or parameter servers on hundreds of devices has hundreds of
slots of tens of thousands of ops each: the peak-memory sweep loops over them compiled (numba), without
sorting the events or holding them all at once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .parallel import over_slots


def op_times(n: int, sched, iteration: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(earliest start, latest end, longest idle gap after) of every op over the slots that run it."""
    ch = sched.chains
    return _op_times(n, ch.ops, ch.dur, sched.end, ch.base, ch.lens, iteration)


@njit(cache=True, nogil=True)
def _op_times(n, ops, dur, end, base, lens, iteration):
    op_start, op_end, op_idle = np.full(n, np.inf), np.zeros(n), np.zeros(n)
    for sl in range(len(base)):
        last = base[sl] + lens[sl] - 1
        for i in range(base[sl], last + 1):
            op = ops[i]
            op_start[op] = min(op_start[op], end[i] - dur[i])
            op_end[op] = max(op_end[op], end[i])
            following = end[i + 1] - dur[i + 1] if i < last else iteration  # the last idles to the end
            op_idle[op] = max(op_idle[op], following - end[i])
    for op in range(n):
        if op_start[op] == np.inf:
            op_start[op] = 0.0
    return op_start, op_end, op_idle


def group_makespans(groups: np.ndarray, num_groups: int, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per group, its ops' latest end less their earliest start (0 for a group without ops). Compiled:
    `np.minimum.at` takes a millisecond on an 18k-op graph in one group."""
    return _makespans(np.asarray(groups, dtype=np.int64), int(num_groups), start, end)


@njit(cache=True, nogil=True)
def _makespans(groups, G, start, end):
    lo, hi = np.full(G, np.inf), np.zeros(G)
    for i in range(len(groups)):
        g = groups[i]
        lo[g] = min(lo[g], start[i])
        hi[g] = max(hi[g], end[i])
    out = np.zeros(G)
    for g in range(G):
        if lo[g] != np.inf:
            out[g] = hi[g] - lo[g]
    return out


def slot_peaks(ctx, sched) -> np.ndarray:
    """Per slot: variables held + the peak of live activations and received buffers under the schedule.

    An activation lives from its op's start until its last local consumer ends or its last transfer out
    is done; a received buffer from the transfer's start until its consumer ends (times its landing count:
    symmetric machines' buffers dropped by slots.py). Peaks are taken just after each allocation, frees at
    the same instant first."""
    ch, t, on, cidx = sched.chains, sched.transfers, sched.on, sched.cidx
    S = len(ch.lens)
    rows, cols = np.nonzero(on[:, ctx.var_inc_op])
    held = np.zeros((S, ctx.num_vars), dtype=bool)
    held[rows, ctx.var_inc_var[cols]] = True
    static = held @ ctx.var_bytes
    del held, rows, cols
    size = _sizes(ch.ops, ch.table, ch.batches / ctx.batch, ctx.act_bytes, ctx.batch_scaled)
    free = sched.end.copy()
    freed_by = np.full(len(free), -1, dtype=np.int64)  # the chain entry whose end frees it (-1: none)
    base = ch.base
    over_slots(_local_frees, ch.lens, free, freed_by, sched.end, base, cidx, ctx.e_src, ctx.e_dst)  # local consumers
    n_t = len(t.cons_op)
    t_ptr = np.zeros(S + 1, dtype=np.int64)
    t_alloc = t_free = t_size = np.zeros(0)
    t_freed_by = np.zeros(0, dtype=np.int64)
    if n_t:
        _transfer_frees(free, freed_by, base, cidx, sched.tr_src_slot, t.src_op, sched.tr_end)
        cons = sched.tr_cons_slot
        by_slot = np.argsort(cons, kind="stable")
        t_cons = cons[by_slot]
        t_ptr[1:] = np.cumsum(np.bincount(t_cons, minlength=S))
        t_alloc = sched.tr_start[by_slot]
        t_freed_by = cidx[t_cons, t.cons_op[by_slot]].astype(np.int64)
        t_free = sched.end[base[t_cons] + t_freed_by]
        t_size = (t.nbytes * sched.tr_landing)[by_slot]
    peak = np.zeros(S)
    over_slots(_sweep, ch.lens, peak, base, ch.lens, ch.dur, sched.end, free, freed_by, size, t_ptr, t_alloc, t_free,
               t_freed_by, t_size)
    return static + np.where(ch.lens == 0, 0.0, peak)


@njit(cache=True, nogil=True)
def _sizes(ops, table, scale, act_bytes, batch_scaled):
    """Bytes each chain entry's outputs take: batch-scaled ones at the batch share it processes."""
    out = np.empty(len(ops))
    for i in range(len(ops)):
        op = ops[i]
        out[i] = act_bytes[op] * (scale[table[i]] if batch_scaled[op] else 1.0)
    return out


@njit(cache=True, nogil=True)
def _local_frees(first, stop, free, freed_by, end, base, cidx, e_src, e_dst):
    """An activation is freed no earlier than the end of each consumer on its slot; freed_by: the last one.
    Slots first..stop-1."""
    for sl in range(first, stop):
        row, b = cidx[sl], base[sl]
        for e in range(len(e_src)):
            ks, kd = row[e_src[e]], row[e_dst[e]]
            if ks >= 0 and kd >= 0 and end[b + kd] > free[b + ks]:
                free[b + ks], freed_by[b + ks] = end[b + kd], kd


@njit(cache=True, nogil=True)
def _transfer_frees(free, freed_by, base, cidx, src_slot, src_op, end):
    """An activation sent elsewhere is freed no earlier than the end of its last transfer out (a PS pull,
    src_op -1, has none)."""
    for i in range(len(src_op)):
        if src_op[i] >= 0:
            k = base[src_slot[i]] + cidx[src_slot[i], src_op[i]]
            if end[i] > free[k]:
                free[k], freed_by[k] = end[i], -1


@njit(cache=True, nogil=True)
def _sweep(first, stop, peak, base, lens, dur, end, free, freed_by, size, t_ptr, t_alloc, t_free, t_freed_by, t_size):
    """Into peak[first:stop], per slot, the most bytes live just after an allocation. A slot's chain allocates
    in time order (it runs one op at a time); its received buffers are merged in. Each free is subtracted just
    before the first allocation at or after it (frees first at one instant), found by galloping: from the start
    of the chain entry whose end frees the buffer, when that start is earlier than the free (a forward
    activation waits for the backward pass, thousands of entries on), else from the buffer's own allocation.
    Only the received buffers are sorted."""
    for sl in range(first, stop):
        b, n = base[sl], lens[sl]
        t0, m = t_ptr[sl], t_ptr[sl + 1] - t_ptr[sl]
        order = np.argsort(t_alloc[t0:t0 + m], kind="mergesort") + t0
        when, amount, dies = np.empty(n + m), np.empty(n + m), np.empty(n + m)
        by = np.empty(n + m, dtype=np.int64)
        at = np.empty(n, dtype=np.int64)  # where each chain entry lands in the merge
        freed = np.zeros(n + m + 1)
        i = j = 0
        for w in range(n + m):
            if j >= m or (i < n and end[b + i] - dur[b + i] <= t_alloc[order[j]]):
                when[w], amount[w], dies[w], by[w] = end[b + i] - dur[b + i], size[b + i], free[b + i], freed_by[b + i]
                at[i] = w
                i += 1
            else:
                k = order[j]
                when[w], amount[w], dies[w], by[w] = t_alloc[k], t_size[k], t_free[k], t_freed_by[k]
                j += 1
        live = best = 0.0
        for w in range(n + m):  # frees land at or after their allocation: freed[w] is whole when reached
            if amount[w] > 0:
                lo = w
                if by[w] >= 0 and at[by[w]] > w and when[at[by[w]]] < dies[w]:  # nothing before it is as late
                    lo = at[by[w]]
                freed[_first_at_or_after(when, lo, dies[w])] += amount[w]
            live -= freed[w]
            live += amount[w]
            if amount[w] > 0 and live > best:
                best = live
        peak[sl] = best


@njit(cache=True, nogil=True)
def _first_at_or_after(when, lo, value):
    """The first index >= lo with when[index] >= value (len(when) if none), when sorted."""
    n = len(when)
    if lo >= n or when[lo] >= value:
        return lo
    step = 1
    while lo + step < n and when[lo + step] < value:  # when[lo] < value throughout
        lo += step
        step *= 2
    hi = min(lo + step, n)
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if when[mid] < value:
            lo = mid
        else:
            hi = mid
    return hi
