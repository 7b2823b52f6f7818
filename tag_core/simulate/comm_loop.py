"""The engine's one sequential part, compiled: communication items in the order of their consumers.

Each item reads when its inputs are ready (a slot's op end, which earlier arrivals may have delayed), waits
for its channels, occupies them and delivers. Chains are flat (slot k's entries from `base[k]`); a slot's
op end is its cumulative duration plus the largest (arrival - when the op could start) at or before it, kept
as running maxima in chain order (`ext_*`, one region of `ext_base[k]..` per slot, as long as the arrivals it
can get). Compiled with numba: at 2048 GPUs a plan has millions of items, a Python loop took seconds.
The arithmetic is the Python form's, in the same order, so results are bit for bit the same.

A task that is one CPU core serves its transfers from threads that its compute holds off the core at first:
until a step's compute has run `busy_send` without a break (the calibration's `busy_send_s`), a tensor
it sends waits, and so does a collective it takes part in (each member sends; while the collective is on
its way, the task's executor runs whatever else is ready, so its core stays busy while its chain has work).
The scheduler lets a thread that woke preempt one only once that one has run a while, and a compute thread
that slept between steps starts with that while in hand (measured on two local servers: a tensor sent at a
step's start waited 2.8 ms, one sent in its middle 0.6 ms). A receiver asks for every tensor as its step
begins, so once a task has let those requests in, nothing it sends waits: a step that began by sending fed
rows on from a computing task (feeds.py) holds none of its transfers again. A collective's members exchange
when it runs, so each collective can wait.
"""

from __future__ import annotations

import numpy as np
from numba import njit

TRANSFER, COLLECTIVE, DELIVERY = 0, 1, 2


@njit(cache=True, nogil=True)
def _last_arrival(ext_base, ext_len, ext_idx, sl, k):
    """Where in slot sl's region the last arrival at or before entry k is (-1: none)."""
    lo, hi = ext_base[sl], ext_base[sl] + ext_len[sl]
    while lo < hi:  # bisect_right - 1
        mid = (lo + hi) >> 1
        if ext_idx[mid] <= k:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1 if lo > ext_base[sl] else -1


@njit(cache=True, nogil=True)
def _end_at(cum, base, ext_base, ext_len, ext_idx, ext_val, sl, k):
    j = _last_arrival(ext_base, ext_len, ext_idx, sl, k)
    return cum[base[sl] + k] + (ext_val[j] if j >= 0 else 0.0)


@njit(cache=True, nogil=True)
def _sender_free(cum, dur, base, lens, ext_base, ext_len, ext_idx, ext_val, sl, k, ready, busy_send):
    """When a tensor that slot sl's entry k made (k = -1: before the step) can leave: at `ready`, unless sl has
    computed without a break since the step began and goes on: then once it has computed busy_send (or its
    chain ends)."""
    after = k + 1
    if after >= lens[sl] or _last_arrival(ext_base, ext_len, ext_idx, sl, after) >= 0:
        return ready  # nothing follows, or the slot has waited for an arrival (its core was free meanwhile)
    first = base[sl]
    chain_end = _end_at(cum, base, ext_base, ext_len, ext_idx, ext_val, sl, lens[sl] - 1)
    return max(ready, min(cum[first] - dur[first] + busy_send, chain_end))


@njit(cache=True, nogil=True)
def _arrive(cum, dur, base, ext_base, ext_len, ext_idx, ext_val, sl, k, when):
    val = when - (cum[base[sl] + k] - dur[base[sl] + k])
    n = ext_len[sl]
    top = ext_base[sl] + n - 1
    if val <= (ext_val[top] if n > 0 else 0.0):
        return
    if n > 0 and ext_idx[top] == k:
        ext_val[top] = val
    else:
        ext_idx[top + 1] = k
        ext_val[top + 1] = val
        ext_len[sl] = n + 1


@njit(cache=True, nogil=True)
def run_items(cum, dur, base, lens, ext_base, item_kind, item_ref,
              t_src_slot, t_src_k, t_cons_slot, t_cons_k, t_chan, t_dur, t_busy, busy_send, collective_busy_send,
              in_ptr, in_slot, in_k, chan_ptr, chan_ids, coll_dur, held, last_grad,
              d_slot, d_k, d_unit, num_channels):
    """Returns (transfer start, transfer end, collective start, collective end, ext_len, ext_idx, ext_val).

    `t_busy[i]`: how long transfer i holds its channel (its duration `t_dur[i]` unless a gap was measured).
    `busy_send`, `collective_busy_send`: how long a computing sender holds a transfer and a collective.
    `held[c]`: collective c waits for the end of the backward pass, the latest end of `last_grad[k]` (a chain
    position, -1 for none) over the slots."""
    S = len(base)
    ext_len = np.zeros(S, dtype=np.int64)
    ext_idx = np.zeros(ext_base[S], dtype=np.int64)
    ext_val = np.zeros(ext_base[S], dtype=np.float64)
    chan_free = np.zeros(num_channels)
    n_t, U = len(t_dur), len(coll_dur)
    tr_start, tr_end = np.zeros(n_t), np.zeros(n_t)
    coll_start, coll_end = np.zeros(U), np.zeros(U)
    barrier = -1.0
    for i in range(len(item_kind)):
        ref = item_ref[i]
        if item_kind[i] == TRANSFER:
            k, sl = t_src_k[ref], t_src_slot[ref]
            ready = _end_at(cum, base, ext_base, ext_len, ext_idx, ext_val, sl, k) if k >= 0 else 0.0
            if busy_send > 0.0:
                ready = _sender_free(cum, dur, base, lens, ext_base, ext_len, ext_idx, ext_val, sl, k, ready,
                                     busy_send)
            ch = t_chan[ref]
            st = ready if ready > chan_free[ch] else chan_free[ch]
            en = st + t_dur[ref]
            chan_free[ch] = st + t_busy[ref]
            tr_start[ref], tr_end[ref] = st, en
            _arrive(cum, dur, base, ext_base, ext_len, ext_idx, ext_val, t_cons_slot[ref], t_cons_k[ref], en)
        elif item_kind[i] == COLLECTIVE:
            ready = 0.0
            for j in range(in_ptr[ref], in_ptr[ref + 1]):  # every member sends, as a transfer's sender does
                member = _end_at(cum, base, ext_base, ext_len, ext_idx, ext_val, in_slot[j], in_k[j])
                if collective_busy_send > 0.0:
                    member = _sender_free(cum, dur, base, lens, ext_base, ext_len, ext_idx, ext_val, in_slot[j],
                                          in_k[j], member, collective_busy_send)
                ready = max(ready, member)
            if held[ref]:
                if barrier < 0.0:
                    barrier = 0.0
                    for sl in range(S):
                        if last_grad[sl] >= 0:
                            barrier = max(barrier, _end_at(cum, base, ext_base, ext_len, ext_idx, ext_val, sl,
                                                           last_grad[sl]))
                ready = max(ready, barrier)
            c0, c1 = chan_ptr[ref], chan_ptr[ref + 1]
            if c1 > c0:
                busy = chan_free[chan_ids[c0]]
                for j in range(c0 + 1, c1):
                    busy = max(busy, chan_free[chan_ids[j]])
                ready = max(ready, busy)
            en = ready + coll_dur[ref]
            for j in range(c0, c1):
                chan_free[chan_ids[j]] = en
            coll_start[ref], coll_end[ref] = ready, en
        else:
            _arrive(cum, dur, base, ext_base, ext_len, ext_idx, ext_val, d_slot[ref], d_k[ref], coll_end[d_unit[ref]])
    return tr_start, tr_end, coll_start, coll_end, ext_len, ext_idx, ext_val


@njit(cache=True, nogil=True)
def chain_ends(cum, base, lens, ext_base, ext_len, ext_idx, ext_val):
    """Every chain entry's end, in place of its cumulative duration: plus the running maximum of the arrivals'
    delays (a plan over hundreds of slots has tens of millions of entries: no copy)."""
    for sl in range(len(base)):
        j, stop, extra = ext_base[sl], ext_base[sl] + ext_len[sl], 0.0
        for k in range(lens[sl]):
            if j < stop and ext_idx[j] == k:
                extra = max(extra, ext_val[j])
                j += 1
            cum[base[sl] + k] += extra
    return cum
