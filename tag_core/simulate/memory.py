"""Per-slot figures from a schedule, vectorised over slots: op start/end/idle and peak memory.

A plan that places model-parallel parts or parameter servers on hundreds of devices has hundreds of
slots; a Python loop per slot (with O(ops + edges) numpy work each) was most of such a simulation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Flat:
    """Every slot's chain, concatenated: entry i is op `ops[i]` on slot `slot[i]`."""

    ops: np.ndarray
    slot: np.ndarray
    start: np.ndarray
    end: np.ndarray
    batch: np.ndarray
    base: np.ndarray  # per slot: index of its first entry
    lens: np.ndarray  # per slot: chain length


def flatten(sched) -> Flat:
    lens = np.array([len(c) for c in sched.chains], dtype=np.int64)
    base = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    cat = lambda xs, dtype: np.concatenate(xs).astype(dtype) if len(xs) else np.zeros(0, dtype)  # noqa: E731
    return Flat(cat(sched.chains, np.int64), np.repeat(np.arange(len(lens)), lens), cat(sched.start, np.float64),
                cat(sched.end, np.float64), cat(sched.batch, np.float64), base, lens)


def op_times(n: int, flat: Flat, iteration: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(earliest start, latest end, longest idle gap after) of every op over the slots that run it."""
    op_start = np.full(n, np.inf)
    op_end = np.zeros(n)
    op_idle = np.zeros(n)
    np.minimum.at(op_start, flat.ops, flat.start)
    np.maximum.at(op_end, flat.ops, flat.end)
    following = np.append(flat.start[1:], iteration)
    last = (flat.base + flat.lens - 1)[flat.lens > 0]
    following[last] = iteration  # a slot's last op idles until the step ends
    np.maximum.at(op_idle, flat.ops, following - flat.end)
    op_start[np.isinf(op_start)] = 0.0
    return op_start, op_end, op_idle


def slot_peaks(ctx, sched, flat: Flat) -> np.ndarray:
    """Per slot: variables held + the peak of live activations and received buffers under the schedule.

    An activation lives from its op's start until its last local consumer ends or its last transfer out
    is done; a received buffer from the transfer's start until its consumer ends (times its landing count:
    symmetric machines' buffers dropped by slots.py). Peaks are taken just after each allocation, frees at
    the same instant first."""
    S = len(sched.chains)
    t, on, cidx = sched.transfers, sched.on, sched.cidx
    rows, cols = np.nonzero(on[:, ctx.var_inc_op])
    held = np.zeros((S, ctx.num_vars), dtype=bool)
    held[rows, ctx.var_inc_var[cols]] = True
    static = held @ ctx.var_bytes
    ops = flat.ops
    size = ctx.act_bytes[ops] * np.where(ctx.batch_scaled[ops], flat.batch / ctx.batch, 1.0)
    free = flat.end.copy()
    kk, ee = np.nonzero(on[:, ctx.e_src] & on[:, ctx.e_dst])
    base = flat.base
    np.maximum.at(free, base[kk] + cidx[kk, ctx.e_src[ee]], flat.end[base[kk] + cidx[kk, ctx.e_dst[ee]]])
    alloc, frees, sizes, slot = [flat.start], [free], [size], [flat.slot]
    if len(t.cons_op):
        out = t.src_op >= 0
        src = sched.tr_src_slot[out]
        np.maximum.at(free, base[src] + cidx[src, t.src_op[out]], sched.tr_end[out])
        cons = sched.tr_cons_slot
        alloc.append(sched.tr_start)
        frees.append(flat.end[base[cons] + cidx[cons, t.cons_op]])
        sizes.append(t.nbytes * sched.tr_landing)
        slot.append(cons)
    a, f, b, sl = (np.concatenate(x) for x in (alloc, frees, sizes, slot))
    m = len(a)
    # Events per slot in time order, frees before allocations at one instant, allocations in their order.
    when = np.concatenate([a, f])
    is_alloc = np.concatenate([np.ones(m, dtype=bool), np.zeros(m, dtype=bool)])
    where = np.concatenate([sl, sl])
    order = np.lexsort((is_alloc, when, where))  # stable: allocations at one instant keep their order
    amount = np.concatenate([b, -b])[order]
    where, is_alloc = where[order], is_alloc[order]
    # Live bytes per slot: one cumulative sum, less its value before each slot's first event.
    running = np.cumsum(amount)
    first = np.searchsorted(where, np.arange(S))
    before = np.where(first > 0, running[np.maximum(first - 1, 0)], 0.0)
    live = running - before[where]
    peak = np.zeros(S)
    np.maximum.at(peak, where[is_alloc], live[is_alloc])
    empty = flat.lens == 0
    return static + np.where(empty, 0.0, peak)
