"""The scheduling core of the simulator.

Model: every device runs its ops one at a time in one global priority order (a
topological order, see `Simulator`); every link channel carries its transfers and
collectives one at a time in the order their consumers come. Because each device's
order is topological, an op's inputs made on the same device are always done before
the op's turn: only inputs from elsewhere (transfers, collectives) can delay it. So a
device's op end times are a prefix scan,

    end[k] = C[k] + max(0, max_{j<=k} (arrival[j] - C[j-1])),   C = cumsum(durations),

and the only sequential Python work is one step per communication item, in the order
of their consumers. Devices that are interchangeable under the strategy (same GPU type,
same batch share in every group, no point-to-point traffic, no single-device ops) are
simulated once: a representative "slot" stands for its whole class, which is exact.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from .expand import transfer_durations
from .slots import Slots, make_slots
from .strategy import Strategy
from .units import ALLREDUCE, KINDS, SINGLE, SPLIT, Collectives, Placement, Transfers


@dataclass
class Schedule:
    slots: Slots
    chains: list[np.ndarray]  # op indices per slot, in execution order
    start: list[np.ndarray]
    end: list[np.ndarray]
    dur: list[np.ndarray]
    on: np.ndarray  # bool (slots, ops)
    cidx: np.ndarray  # (slots, ops): position of the op in the slot's chain, -1 if absent
    batch: list[np.ndarray]  # effective batch of each chain op
    tr_start: np.ndarray
    tr_end: np.ndarray
    tr_dur: np.ndarray
    tr_src_slot: np.ndarray
    tr_cons_slot: np.ndarray
    coll_start: np.ndarray
    coll_end: np.ndarray
    iteration: float
    transfers: Transfers | None = None  # the transfers simulated (make_slots may drop symmetric machines')
    tr_weight: np.ndarray | None = None  # per simulated transfer: how many real ones it stands for
    tr_landing: np.ndarray | None = None  # ... and how many of those land on its consumer's device


def schedule(ctx, p: Placement, s: Strategy, t: Transfers, colls: Collectives, machines: bool = True) -> Schedule:
    """`machines`: collapse symmetric machines (slots.py); off for a timeline, which shows every transfer."""
    slots = make_slots(ctx, p, t, machines)
    weight = landing = np.ones(len(t.cons_op))
    if slots.keep is not None:
        t = Transfers(*(getattr(t, f)[slots.keep] for f in ("cons_op", "cons_dev", "src_op", "src_dev", "nbytes",
                                                           "channel", "kind")))
        weight, landing = slots.weight, slots.landing
    S, n = len(slots.dev), ctx.n
    g_of = s.op_groups
    on = np.ascontiguousarray(p.group_active[:, slots.dev].T)[:, g_of] & (p.kind != SINGLE)[None, :]  # (slots, ops), row-major
    single_ops = np.flatnonzero(p.kind == SINGLE)
    on[slots.of_dev[p.single_dev[single_ops]], single_ops] = True
    order, pos = _execution_order(ctx, s)
    # (slots, ops) int32: a plan over 2048 slots of an 18k-op graph would hold 300 MB in int64.
    cidx = np.full((S, n), -1, dtype=np.int32 if n < 2**31 else np.int64)
    chains, durs, batches, C = [], [], [], []
    for k in range(S):
        d = int(slots.dev[k])
        ops = order[on[k, order]]
        eb = np.where(p.kind[ops] == SPLIT, ctx.batch * p.group_share[g_of[ops], d], float(ctx.batch))
        dur = _durations(ctx, ctx.dev_gpu[d], ops, eb)
        cidx[k, ops] = np.arange(len(ops))
        cum = np.cumsum(dur)
        # int32 ops, and C[k] - dur[k] (when op k may start) read where needed: at 681 slots of an 18k-op
        # graph each array per (slot, op) is 100 MB.
        chains.append(ops.astype(np.int32)), durs.append(dur), batches.append(eb)
        C.append(cum)

    # ---- communication items, in the order of their consumers ----
    tr_dur = transfer_durations(ctx, t)
    src_slot = slots.of_dev[t.src_dev]
    cons_slot = slots.of_dev[t.cons_dev]
    src_k = np.where(t.src_op >= 0, cidx[src_slot, np.maximum(t.src_op, 0)], -1)
    cons_k = cidx[cons_slot, t.cons_op]
    n_t = len(t.cons_op)
    keys_pos = [pos[t.cons_op]]
    keys_rank = [np.ones(n_t, dtype=np.int64)]
    kinds = [np.zeros(n_t, dtype=np.int64)]
    refs = [np.arange(n_t)]
    U = len(colls)
    coll_inputs: list[list[tuple[int, int]]] = [[] for _ in range(U)]
    deliveries: list[tuple[int, int, int]] = []
    if U:
        # A unit waits for the last of its gradients on each slot; on each slot only its first
        # consumer needs the arrival (the slot runs everything after it later anyway).
        big = np.iinfo(np.int64).max
        k_in = cidx[:, colls.inp_op]  # (S, inputs)
        last = np.full((S, U), -1, dtype=np.int64)
        np.maximum.at(last, (np.repeat(np.arange(S), len(colls.inp_op)), np.tile(colls.inp_unit, S)), k_in.ravel())
        for sl, u in zip(*np.nonzero(last >= 0)):
            coll_inputs[u].append((int(sl), int(last[sl, u])))
        k_cons = cidx[:, colls.cons_op].astype(np.int64)
        k_cons = np.where(k_cons >= 0, k_cons, big)
        first = np.full((S, U), big, dtype=np.int64)
        np.minimum.at(first, (np.repeat(np.arange(S), len(colls.cons_op)), np.tile(colls.cons_unit, S)), k_cons.ravel())
        d_slot, d_unit = np.nonzero(first < big)
        d_k = first[d_slot, d_unit]
        d_op = np.array([chains[a][b] for a, b in zip(d_slot.tolist(), d_k.tolist())], dtype=np.int64)
        d_pos = pos[d_op]
        u_pos = np.full(U, big, dtype=np.int64)
        np.minimum.at(u_pos, d_unit, d_pos)
        keys_pos += [u_pos, d_pos]
        keys_rank += [np.zeros(U, dtype=np.int64), np.full(len(d_pos), 2)]
        kinds += [np.ones(U, dtype=np.int64), np.full(len(d_pos), 2)]
        refs += [np.arange(U), np.arange(len(d_pos))]
        deliveries = list(zip(d_slot.tolist(), d_k.tolist(), d_unit.tolist()))
    pos_all, rank_all = np.concatenate(keys_pos), np.concatenate(keys_rank)
    item_order = np.lexsort((rank_all, pos_all))
    item_kind = np.concatenate(kinds)[item_order].tolist()
    item_ref = np.concatenate(refs)[item_order].tolist()

    ext_idx: list[list[int]] = [[] for _ in range(S)]
    ext_val: list[list[float]] = [[] for _ in range(S)]

    def end_at(sl: int, k: int) -> float:
        idx = ext_idx[sl]
        j = bisect_right(idx, k) - 1
        return float(C[sl][k]) + (ext_val[sl][j] if j >= 0 else 0.0)

    def arrive(sl: int, k: int, when: float) -> None:
        # Keep only running maxima of (arrival - C[k-1]): entries come in chain order per slot.
        val = when - (float(C[sl][k]) - float(durs[sl][k]))
        vals = ext_val[sl]
        if val <= (vals[-1] if vals else 0.0):
            return
        idx = ext_idx[sl]
        if idx and idx[-1] == k:
            vals[-1] = val
        else:
            idx.append(k)
            vals.append(val)

    # When each channel the step uses is next free, numbered compactly (4096 machines have 8M channels): a
    # collective over every machine holds thousands, read and set as one array operation, not a Python loop.
    t_chan, coll_chans = _compact_channels(t.channel, colls.channels)
    chan_free = np.zeros(1 + max([int(t_chan.max()) if n_t else -1] + [int(c.max()) for c in coll_chans if len(c)]))
    tr_start = np.zeros(n_t)
    tr_end = np.zeros(n_t)
    t_src_slot, t_src_k, t_cons_slot, t_cons_k = src_slot.tolist(), src_k.tolist(), cons_slot.tolist(), cons_k.tolist()
    t_chan, t_dur = t_chan.tolist(), tr_dur.tolist()
    coll_dur = colls.duration.tolist()
    held = colls.kind == ALLREDUCE  # without overlap, gradient all-reduces wait for the backward pass ...
    if colls.statistic is not None:
        held &= ~colls.statistic  # ... but a statistic's is on its way
    held = held.tolist()
    coll_start = np.zeros(len(colls))
    coll_end = np.zeros(len(colls))
    coll_end_l = [0.0] * len(colls)
    barrier = None
    for kind, ref in zip(item_kind, item_ref):
        if kind == 0:  # point-to-point transfer
            k = t_src_k[ref]
            ready = end_at(t_src_slot[ref], k) if k >= 0 else 0.0
            ch = t_chan[ref]
            free = float(chan_free[ch])
            st = ready if ready > free else free
            en = st + t_dur[ref]
            chan_free[ch] = en
            tr_start[ref], tr_end[ref] = st, en
            arrive(t_cons_slot[ref], t_cons_k[ref], en)
        elif kind == 1:  # collective
            ready = max((end_at(sl, k) for sl, k in coll_inputs[ref]), default=0.0)
            if not s.overlap and held[ref]:
                if barrier is None:
                    barrier = _backward_end(ctx, chains, end_at)
                ready = max(ready, barrier)
            chans = coll_chans[ref]
            if len(chans):
                ready = max(ready, float(chan_free[chans].max()))
            en = ready + coll_dur[ref]
            chan_free[chans] = en
            coll_start[ref], coll_end[ref] = ready, en
            coll_end_l[ref] = en
        else:  # delivery of a collective's result to one consumer
            sl, k, c = deliveries[ref]
            arrive(sl, k, coll_end_l[c])

    starts, ends = [], []
    iteration = 0.0
    for k in range(S):
        m = np.zeros(len(chains[k]))
        if ext_idx[k]:
            m[ext_idx[k]] = ext_val[k]
            np.maximum.accumulate(m, out=m)
        end = C[k] + m
        starts.append(end - durs[k])
        ends.append(end)
        if len(end):
            iteration = max(iteration, float(end[-1]))
    if n_t:
        iteration = max(iteration, float(tr_end.max()))
    if len(colls):
        iteration = max(iteration, float(coll_end.max()))
    return Schedule(slots, chains, starts, ends, durs, on, cidx, batches, tr_start, tr_end, tr_dur, src_slot,
                    cons_slot, coll_start, coll_end, iteration, t, weight, landing)


def _compact_channels(tr_chan: np.ndarray, coll_chans: list) -> tuple[np.ndarray, list[np.ndarray]]:
    """Channel ids renumbered 0..k-1 over the channels this step uses: the transfers' and, per collective, an
    index array. Units of one group share their channel tuple (one object), so each distinct tuple is mapped
    once."""
    distinct = {id(c): c for c in coll_chans}
    parts = [np.asarray(tr_chan, dtype=np.int64)] + [np.asarray(c, dtype=np.int64) for c in distinct.values()]
    used, inverse = np.unique(np.concatenate(parts), return_inverse=True)
    inverse = inverse.reshape(-1)
    bounds = np.cumsum([len(x) for x in parts])
    mapped = dict(zip(distinct, np.split(inverse[bounds[0]:], bounds[1:-1] - bounds[0])))
    return inverse[:bounds[0]], [mapped[id(c)] for c in coll_chans]


def _execution_order(ctx, s: Strategy) -> tuple[np.ndarray, np.ndarray]:
    """The simulator's priority order, with SFB's duplicated ops moved to just before the update.

    Devices run their ops in order, so an op waiting for gathered factors would hold back the
    rest of the backward pass; TF's executor runs whatever is ready instead. An op moves only
    when everything it feeds moves too or belongs to the update, so the order stays topological.
    """
    if not s.sfb:
        return ctx.order, ctx.pos
    moved = np.zeros(ctx.n, dtype=bool)
    for ops in s.sfb.values():
        moved[ops] = True
    for i in ctx.order[::-1][moved[ctx.order[::-1]]].tolist():
        moved[i] = all(moved[j] or ctx.tail[j] for j in ctx.successors[i])
    late = moved[ctx.order]
    tail = ctx.tail[ctx.order]
    order = np.concatenate([ctx.order[~late & ~tail], ctx.order[late & ~tail], ctx.order[tail]])
    pos = np.empty(ctx.n, dtype=np.int64)
    pos[order] = np.arange(ctx.n)
    return order, pos


def _durations(ctx, gpu, ops: np.ndarray, eb: np.ndarray) -> np.ndarray:
    values = np.unique(eb)
    if len(values) == 1:
        return ctx.compute.times(gpu, float(values[0]))[ops]
    out = np.empty(len(ops))
    for b in values.tolist():
        sel = eb == b
        out[sel] = ctx.compute.times(gpu, b)[ops[sel]]
    return out


def _backward_end(ctx, chains, end_at) -> float:
    """When the last gradient op finishes on any device (sync waits for it without overlap)."""
    last = 0.0
    for sl, ops in enumerate(chains):
        grads = np.flatnonzero(ctx.is_gradient[ops])
        if len(grads):
            last = max(last, end_at(sl, int(grads[-1])))
    return last


def comm_totals(t: Transfers, sched: Schedule, colls: Collectives) -> dict[str, float]:
    """Seconds of communication by kind (transfers summed; a collective counted once)."""
    totals = {name: 0.0 for name in KINDS}
    if len(t.kind):
        weight = sched.tr_dur if sched.tr_weight is None else sched.tr_dur * sched.tr_weight
        sums = np.bincount(t.kind, weights=weight, minlength=len(KINDS))
        for i, name in enumerate(KINDS):
            totals[name] += float(sums[i])
    if len(colls):
        sums = np.bincount(colls.kind, weights=colls.duration, minlength=len(KINDS))
        for i, name in enumerate(KINDS):
            totals[name] += float(sums[i])
    return totals
