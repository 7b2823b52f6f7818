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
    cat = lambda xs, dtype: np.concatenate(xs).astype(dtype, copy=False) if len(xs) else np.zeros(0, dtype)  # noqa: E731
    index = np.int32 if len(lens) < 2**31 else np.int64  # ops and slots: tens of millions of entries
    return Flat(cat(sched.chains, index), np.repeat(np.arange(len(lens), dtype=index), lens),
                cat(sched.start, np.float64), cat(sched.end, np.float64), cat(sched.batch, np.float64), base, lens)


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
    the same instant first. Slots are swept in blocks of about CHUNK_ENTRIES chain entries: a plan with
    thousands of slots of an 18k-op graph has tens of millions of events, gigabytes if sorted at once."""
    S = len(flat.lens)
    t, on, cidx = sched.transfers, sched.on, sched.cidx
    rows, cols = np.nonzero(on[:, ctx.var_inc_op])
    held = np.zeros((S, ctx.num_vars), dtype=bool)
    held[rows, ctx.var_inc_var[cols]] = True
    static = held @ ctx.var_bytes
    del held, rows, cols
    ops = flat.ops
    size = ctx.act_bytes[ops] * np.where(ctx.batch_scaled[ops], flat.batch / ctx.batch, 1.0)
    free = flat.end.copy()
    base = flat.base
    blocks = _blocks(flat.lens)
    kk = ee = None
    for lo, hi in blocks:  # local consumers hold an activation until they end
        kk, ee = np.nonzero(on[lo:hi, ctx.e_src] & on[lo:hi, ctx.e_dst])
        kk += lo
        np.maximum.at(free, base[kk] + cidx[kk, ctx.e_src[ee]], flat.end[base[kk] + cidx[kk, ctx.e_dst[ee]]])
    del kk, ee  # the last block's pairs: up to CHUNK_ENTRIES x edges
    n_t = len(t.cons_op)
    if n_t:
        out = t.src_op >= 0
        src = sched.tr_src_slot[out]
        np.maximum.at(free, base[src] + cidx[src, t.src_op[out]], sched.tr_end[out])
        cons = sched.tr_cons_slot
        by_slot = np.argsort(cons, kind="stable")  # transfers per block, in their order
        t_cons = cons[by_slot]
        t_alloc = sched.tr_start[by_slot]
        t_free = flat.end[base[t_cons] + cidx[t_cons, t.cons_op[by_slot]]]
        t_size = (t.nbytes * sched.tr_landing)[by_slot]
    peak = np.zeros(S)
    for lo, hi in blocks:
        f0, f1 = int(base[lo]), int(base[hi - 1] + flat.lens[hi - 1])
        a, f, b, sl = flat.start[f0:f1], free[f0:f1], size[f0:f1], flat.slot[f0:f1]
        if n_t:
            t0, t1 = np.searchsorted(t_cons, [lo, hi])
            a, f, b, sl = (np.concatenate(x) for x in ((a, t_alloc[t0:t1]), (f, t_free[t0:t1]), (b, t_size[t0:t1]),
                                                          (sl, t_cons[t0:t1])))
        _block_peaks(peak, lo, hi, a, f, b, sl)
    empty = flat.lens == 0
    return static + np.where(empty, 0.0, peak)


CHUNK_ENTRIES = 1 << 19  # chain entries per block of slots (events twice that: ~100 MB of temporaries)


def _blocks(lens: np.ndarray) -> list[tuple[int, int]]:
    """[lo, hi) runs of slots of about CHUNK_ENTRIES chain entries each (a longer chain is a block alone)."""
    out, lo, total = [], 0, 0
    for k, n in enumerate(lens.tolist()):
        if k > lo and total + n > CHUNK_ENTRIES:
            out.append((lo, k))
            lo, total = k, 0
        total += n
    if len(lens):
        out.append((lo, len(lens)))
    return out


def _block_peaks(peak: np.ndarray, lo: int, hi: int, a: np.ndarray, f: np.ndarray, b: np.ndarray,
                 sl: np.ndarray) -> None:
    """Peaks of slots lo..hi-1 from their allocations (time a, free time f, bytes b, slot sl), into `peak`."""
    # Nothing allocated, nothing to count: live bytes just after a zero-byte allocation are at most what they
    # were after the allocation before it (a quarter of the ops of the large graphs have no output bytes).
    keep = b > 0
    a, f, b, sl = a[keep], f[keep], b[keep], sl[keep]
    m = len(a)
    # Events per slot in time order, frees before allocations at one instant, allocations in their order.
    when = np.concatenate([a, f])
    is_alloc = np.concatenate([np.ones(m, dtype=bool), np.zeros(m, dtype=bool)])
    where = np.concatenate([sl, sl])
    if hi - lo <= 1 << 16 and (when >= 0).all():
        # Two stable passes instead of lexsort's three: (time, free first) as one integer (a non-negative
        # float's bits order as the float does; the sign bit is free for the flag), then the slot, a radix sort.
        key = ((when + 0.0).view(np.uint64) << np.uint64(1)) | is_alloc.astype(np.uint64)
        by_time = np.argsort(key, kind="stable")
        del key
        order = by_time[np.argsort((where - lo).astype(np.uint16)[by_time], kind="stable")]
        del by_time
    else:
        order = np.lexsort((is_alloc, when, where))  # stable: allocations at one instant keep their order
    del when
    amount = np.concatenate([b, -b])[order]
    where, is_alloc = where[order], is_alloc[order]
    del order
    # Live bytes per slot: one cumulative sum, less its value before each slot's first event.
    running = np.cumsum(amount)
    first = np.searchsorted(where, np.arange(lo, hi))
    before = np.where(first > 0, running[np.maximum(first - 1, 0)], 0.0)
    live = running - before[where - lo]
    np.maximum.at(peak, where[is_alloc], live[is_alloc])
