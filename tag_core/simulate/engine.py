"""The scheduling core of the simulator.

Model: every device runs its ops one at a time in one global priority order (a
topological order, see `Simulator`); every link channel carries its transfers and
collectives one at a time in the order their consumers come. Because each device's
order is topological, an op's inputs made on the same device are always done before
the op's turn: only inputs from elsewhere (transfers, collectives) can delay it. So a
device's op end times are a prefix scan,

    end[k] = C[k] + max(0, max_{j<=k} (arrival[j] - C[j-1])),   C = cumsum(durations),

and the only sequential work is one step per communication item, in the order of their
consumers (compiled: comm_loop.py). Devices that are interchangeable under the strategy (same GPU type,
same batch share in every group, no point-to-point traffic, no single-device ops) are
simulated once: a representative "slot" stands for its whole class, which is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .chains import Chains, build_chains
from .comm_cpu import charge_endpoints
from .comm_loop import chain_ends, run_items
from .expand import transfer_durations
from .slots import Slots, make_slots
from .strategy import Strategy
from .units import ALLREDUCE, KINDS, SINGLE, TRANSFER_FIELDS, Collectives, Placement, Transfers


@dataclass
class Schedule:
    slots: Slots
    chains: Chains  # every slot's ops in execution order, flat, with durations and batches
    end: np.ndarray  # per chain entry
    on: np.ndarray  # bool (slots, ops)
    cidx: np.ndarray  # (slots, ops): position of the op in the slot's chain, -1 if absent
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

    @property
    def start(self) -> np.ndarray:
        return self.end - self.chains.dur


def schedule(ctx, p: Placement, s: Strategy, t: Transfers, colls: Collectives, order: np.ndarray, pos: np.ndarray,
             machines: bool = True, rows_forwarded: bool = False) -> Schedule:
    """`order`, `pos`: the strategy's execution order and each op's place in it (`execution_order`).
    `machines`: collapse symmetric machines (slots.py); off for a timeline, which shows every transfer.
    `rows_forwarded`: the step began with input rows sent on from a computing task (feeds.py), which waited
    for its compute to let them go; the other tasks' requests for its tensors went out with theirs, so no
    transfer of the schedule waits for a busy sender again (a collective, begun mid-step, still does).
    When the collapse drops transfers, `t` is used up (its fields are let go): the kept ones are in the
    Schedule, and a PS on thousands of GPUs has ten times as many dropped as kept."""
    slots = make_slots(ctx, p, t, machines)
    weight = landing = sending = np.ones(len(t.cons_op))
    if slots.keep is not None:
        kept = {}
        for f in TRANSFER_FIELDS:
            kept[f] = getattr(t, f)[slots.keep]
            setattr(t, f, None)
        t = Transfers(**kept)
        weight, landing, sending = slots.weight, slots.landing, slots.sending
    S, n = len(slots.dev), ctx.n
    g_of = s.op_groups
    on = np.ascontiguousarray(p.group_active[:, slots.dev].T)[:, g_of] & (p.kind != SINGLE)[None, :]  # (slots, ops), row-major
    single_ops = np.flatnonzero(p.kind == SINGLE)
    on[slots.of_dev[p.single_dev[single_ops]], single_ops] = True
    # (slots, ops) int32: a plan over 2048 slots of an 18k-op graph would hold 300 MB in int64.
    cidx = np.full((S, n), -1, dtype=np.int32 if n < 2**31 else np.int64)
    ch = build_chains(ctx, p, s, slots, order, pos, cidx)

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
    lens, base, ops_flat = ch.lens, ch.base, ch.ops
    in_slot = in_k = d_slot = d_k = d_unit = np.zeros(0, dtype=np.int64)
    in_count = np.zeros(U, dtype=np.int64)
    if U:
        # A unit waits for the last of its gradients on each slot; on each slot only its first
        # consumer needs the arrival (the slot runs everything after it later anyway).
        big = np.iinfo(np.int64).max
        k_in = cidx[:, colls.inp_op]  # (S, inputs)
        # Flat (slot * U + unit) indices: ufunc.at takes a fast path for one index array, not for a tuple.
        slot_row = np.arange(S, dtype=np.int64)[:, None] * U
        last = np.full(S * U, -1, dtype=np.int64)
        np.maximum.at(last, (slot_row + colls.inp_unit[None, :]).ravel(), k_in.ravel())
        last = last.reshape(S, U)
        in_slot, in_unit = np.nonzero(last >= 0)
        by_unit = np.argsort(in_unit, kind="stable")
        in_slot, in_k = in_slot[by_unit], last[in_slot[by_unit], in_unit[by_unit]]
        in_count = np.bincount(in_unit, minlength=U)
        k_cons = cidx[:, colls.cons_op].astype(np.int64)
        k_cons = np.where(k_cons >= 0, k_cons, big)
        first = np.full(S * U, big, dtype=np.int64)
        np.minimum.at(first, (slot_row + colls.cons_unit[None, :]).ravel(), k_cons.ravel())
        first = first.reshape(S, U)
        d_slot, d_unit = np.nonzero(first < big)
        d_k = first[d_slot, d_unit]
        d_pos = pos[ops_flat[base[d_slot] + d_k]]
        u_pos = np.full(U, big, dtype=np.int64)
        np.minimum.at(u_pos, d_unit, d_pos)
        keys_pos += [u_pos, d_pos]
        keys_rank += [np.zeros(U, dtype=np.int64), np.full(len(d_pos), 2)]
        kinds += [np.ones(U, dtype=np.int64), np.full(len(d_pos), 2)]
        refs += [np.arange(U), np.arange(len(d_pos))]
    pos_all, rank_all = np.concatenate(keys_pos), np.concatenate(keys_rank)
    item_order = np.lexsort((rank_all, pos_all))

    # Of a transfer's time, its bytes': its latency is a wait that the next transfer and compute can overlap.
    unhidden, gap = 1.0 - ctx.comm.compute_overlap, ctx.comm.transfer_gap_s
    moving = t.nbytes / ctx.channel_bps[t.channel] if unhidden > 0 or gap is not None else None
    if unhidden > 0:
        charge_endpoints(ch, unhidden, moving, src_slot, src_k, cons_slot, cons_k, sending, landing, d_slot, d_k,
                         colls.duration[d_unit] if U else np.zeros(0))
    tr_dur = tr_dur.astype(np.float64)
    held_for = tr_dur if gap is None else gap + moving  # how long each transfer holds its channel

    # When each channel the step uses is next free, numbered compactly (4096 machines have 8M channels).
    t_chan, coll_chans = _compact_channels(t.channel, colls.channels, ctx.num_channels)
    num_channels = 1 + max([int(t_chan.max()) if n_t else -1] + [int(c.max()) for c in coll_chans if len(c)])
    cum, dur_flat = ch.cum, ch.dur
    # Room for every arrival a slot can get: one per transfer into it and per delivery to it.
    room = np.bincount(cons_slot, minlength=S) + np.bincount(d_slot, minlength=S)
    ext_base = np.concatenate([[0], np.cumsum(room)]).astype(np.int64)
    chan_count = np.array([len(c) for c in coll_chans], dtype=np.int64)
    chan_ids = np.concatenate(coll_chans).astype(np.int64) if U else np.zeros(0, dtype=np.int64)
    held = colls.kind == ALLREDUCE  # without overlap, gradient all-reduces wait for the backward pass ...
    if colls.statistic is not None:
        held &= ~colls.statistic  # ... but a statistic's is on its way
    held &= not s.overlap
    last_grad = _last_gradients(ctx, ch) if held.any() else np.full(S, -1, dtype=np.int64)
    tr_start, tr_end, coll_start, coll_end, ext_len, ext_idx, ext_val = run_items(
        cum, dur_flat, base, lens, ext_base, np.concatenate(kinds)[item_order], np.concatenate(refs)[item_order],
        src_slot.astype(np.int64), src_k.astype(np.int64), cons_slot.astype(np.int64), cons_k.astype(np.int64),
        t_chan.astype(np.int64), tr_dur, held_for, 0.0 if rows_forwarded else float(ctx.comm.busy_send_s),
        float(ctx.comm.busy_send_s),
        _pointers(in_count), in_slot.astype(np.int64), in_k.astype(np.int64), _pointers(chan_count), chan_ids,
        colls.duration.astype(np.float64), held, last_grad, d_slot.astype(np.int64), d_k.astype(np.int64),
        d_unit.astype(np.int64), num_channels)
    end_flat = chain_ends(cum, base, lens, ext_base, ext_len, ext_idx, ext_val)
    ch.cum = None  # now the ends
    iteration = float(end_flat[base[lens > 0] + lens[lens > 0] - 1].max()) if (lens > 0).any() else 0.0
    if n_t:
        iteration = max(iteration, float(tr_end.max()))
    if len(colls):
        iteration = max(iteration, float(coll_end.max()))
    return Schedule(slots, ch, end_flat, on, cidx, tr_start, tr_end, tr_dur, src_slot,
                    cons_slot, coll_start, coll_end, iteration, t, weight, landing)


def _compact_channels(tr_chan: np.ndarray, coll_chans: list, total: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Channel ids (of `total`) renumbered 0..k-1 over the channels this step uses, in id order: the transfers'
    and, per collective, an index array. Units of one group share their channel tuple (one object), so each
    distinct tuple is mapped once. A mark per channel id, not a sort: a PS on thousands of GPUs has millions
    of transfers."""
    distinct = {id(c): np.asarray(c, dtype=np.int64) for c in coll_chans}
    tr_chan = np.asarray(tr_chan, dtype=np.int64)
    used = np.zeros(total, dtype=bool)
    used[tr_chan] = True
    for c in distinct.values():
        used[c] = True
    rank = np.cumsum(used, dtype=np.int32 if total < 2**31 else np.int64) - 1
    mapped = {key: rank[c] for key, c in distinct.items()}
    return rank[tr_chan], [mapped[id(c)] for c in coll_chans]


def execution_order(ctx, s: Strategy) -> tuple[np.ndarray, np.ndarray]:
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


def _last_gradients(ctx, ch: Chains) -> np.ndarray:
    """Per slot, the chain position of its last gradient op (-1 for none): without overlap, sync waits for
    the latest of their ends."""
    out = np.full(len(ch.lens), -1, dtype=np.int64)
    entries = np.flatnonzero(ctx.is_gradient[ch.ops])
    slot = np.searchsorted(ch.base, entries, side="right") - 1  # base is sorted; empty slots share a base
    np.maximum.at(out, slot, entries - ch.base[slot])
    return out


def _pointers(counts: np.ndarray) -> np.ndarray:
    """CSR row pointers from row lengths."""
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


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
