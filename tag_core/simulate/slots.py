"""Slots: the devices the engine simulates, one representative per class of devices the strategy treats alike.

Two kinds of symmetry, both exact:
- devices with no point-to-point traffic and no single-device ops, of one GPU type and with the same batch
  share in every group, run the same chain at the same times (only collectives touch them);
- whole machines of one machine class (tag_core/cluster/classes.py) whose traffic goes only to "anchor"
  machines (those holding single-device ops: parameter servers, model-parallel parts) or stays inside
  them, with the same shares and the same transfers (ops, bytes, duration, local device, anchor device):
  each such machine's transfers run on its own machine-pair channels, so every machine of the group sees
  the same times. One representative machine is simulated; the others' transfers are dropped and
  counted through `weight` (a PS on 2048 GPUs would otherwise be 2048 slots and ~10⁵ transfers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from .units import Transfers

MAX_COVER_ROUNDS = 32  # greedy rounds of pinning machines; what is left after them is pinned whole
_OFFSET, _PRIME, _GOLDEN = 0xCBF29CE484222325, 0x100000001B3, 0x9E3779B97F4A7C15  # the row hash's constants


@dataclass
class Slots:
    dev: np.ndarray  # representative device of each slot
    of_dev: np.ndarray  # slot of each device
    size: np.ndarray  # devices per slot
    keep: np.ndarray | None = None  # transfers the engine simulates (None: all)
    weight: np.ndarray | None = None  # per kept transfer: how many real transfers it stands for
    landing: np.ndarray | None = None  # per kept transfer: how many of those land on its consumer's device
    sending: np.ndarray | None = None  # ... and how many of those leave its source's device


def make_slots(ctx, p, t: Transfers, machines: bool = True) -> Slots:
    D = ctx.num_devices
    touched = np.zeros(D, dtype=bool)
    touched[t.src_dev] = True
    touched[t.cons_dev] = True
    touched[p.single_dev[p.single_dev >= 0]] = True
    if not getattr(ctx, "collapse", True):
        touched[:] = True
    eff, kept = np.arange(D), (None, None, None, None)
    if machines and getattr(ctx, "collapse", True) and len(t.cons_op) and getattr(ctx, "machine_class", None) is not None:
        eff, kept = _machine_collapse(ctx, p, t, touched)
    # Key per device: its own (or its representative's) index when touched, else (GPU type, share in every
    # group); slots are numbered by first device, vectorised (a Python loop over 8192 devices costs more).
    share = np.where(touched[None, :], 0.0, np.round(p.group_share, 12))
    key = _mix(np.where(touched, eff, -1), np.where(touched, -1, ctx.dev_gpu_id), *share)  # 64-bit row hash
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(first), dtype=np.int64)
    rank[order] = np.arange(len(first))
    of_dev = rank[inverse.reshape(-1)]
    reps = first[order].astype(np.int64)
    return Slots(reps, of_dev, np.bincount(of_dev, minlength=len(reps)), *kept)


def _machine_collapse(ctx, p, t: Transfers, touched: np.ndarray):
    """(representative device per device, (transfers kept, their weights, landing and sending counts)); see
    the module docstring."""
    dm, M = ctx.dev_machine, ctx.topology.num_machines
    anchor = np.zeros(M, dtype=bool)
    anchor[dm[p.single_dev[p.single_dev >= 0]]] = True
    # Traffic between two machines neither of which is an anchor: pin a small set of machines that covers
    # every such pair (greedy, the machines with the most partners first: one machine feeding a group on all
    # the others, or a few machines feeding a group on many), so the many on the other side still collapse.
    pairs = _loose_pairs(dm, t.src_dev, t.cons_dev, anchor)
    if len(pairs):
        pairs = np.unique(pairs, axis=0)
        for _ in range(MAX_COVER_ROUNDS):
            partners = np.bincount(pairs.ravel(), minlength=M)
            anchor[partners == partners.max()] = True
            pairs = pairs[~anchor[pairs[:, 0]] & ~anchor[pairs[:, 1]]]
            if not len(pairs):
                break
        anchor[pairs.ravel()] = True
    start = ctx.machine_first_device
    h, h2 = _fingerprints(M, dm, start, t.src_dev, t.cons_dev, t.src_op, t.cons_op, t.kind, t.nbytes,
                          t.channel, ctx.channel_latency, ctx.channel_bps)
    eff = np.arange(len(dm))
    rep_of = np.arange(M)
    for members in ctx.machine_class_members:
        free = members[~anchor[members]]
        if len(free) < 2:
            continue
        count = int(ctx.topology.machines[int(free[0])].count)
        devs = start[free][:, None] + np.arange(count)[None, :]  # (machines, count)
        shares = np.round(p.group_share[:, devs], 12).transpose(1, 0, 2).reshape(len(free), -1)
        key = _mix(h[free], h2[free], *touched[devs].T, *shares.T)
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        rep = free[first[inverse.reshape(-1)]]
        rep_of[free] = rep
        eff[devs] = (start[rep][:, None] + np.arange(count)[None, :])
    if (rep_of == np.arange(M)).all():
        return eff, (None, None, None, None)
    return eff, _kept(dm, t.src_dev, t.cons_dev, rep_of, anchor, np.bincount(rep_of, minlength=M))


def _mix(*cols) -> np.ndarray:
    """A 64-bit hash per row of the columns (wrapping multiply-xor; floats by their bits)."""
    n = next(len(c) for c in cols if np.ndim(c))
    out = np.full(n, _OFFSET, dtype=np.uint64)
    prime = np.uint64(_PRIME)
    with np.errstate(over="ignore"):
        for c in cols:
            v = np.asarray(c)
            if v.dtype.kind == "f":
                v = (v + 0.0).view(np.uint64)  # + 0.0: -0.0 and 0.0 hash alike
            elif v.dtype.kind == "b":
                v = v.astype(np.uint64)
            else:
                v = v.astype(np.int64).view(np.uint64) if v.dtype != np.uint64 else v
            out = (out ^ v) * prime
            out ^= out >> np.uint64(29)
    return out


@njit(cache=True, nogil=True)
def _fingerprints(M, dm, start, src_dev, cons_dev, src_op, cons_op, kind, nbytes, channel, latency, bps):
    """A multiset fingerprint of each machine's transfers: two wrapping sums of a per-row hash (order-free), the
    row as each end sees it: the side, its own local device, the other end (by local index when inside the
    machine), the ops, kind, bytes and duration (to the picosecond). One pass: a PS on thousands of GPUs has
    millions of transfers, and a hash step per column over all of them would be a temporary each."""
    h, h2 = np.zeros(M, dtype=np.uint64), np.zeros(M, dtype=np.uint64)
    bits = np.empty(2)
    as_int = bits.view(np.uint64)
    for i in range(len(cons_op)):
        c = channel[i]
        bits[0] = np.rint((latency[c] + nbytes[i] / bps[c]) * 1e12) + 0.0  # its duration; -0.0 hashes as 0.0
        bits[1] = np.rint(nbytes[i]) + 0.0
        for side in range(2):
            dev, other = (src_dev[i], cons_dev[i]) if side == 0 else (cons_dev[i], src_dev[i])
            m, other_m = dm[dev], dm[other]
            other_id = -1 - (other - start[other_m]) if other_m == m else other
            row = np.uint64(_OFFSET)
            for v in (np.uint64(side), np.uint64(dev - start[m]), np.uint64(other_id), np.uint64(src_op[i]),
                      np.uint64(cons_op[i]), np.uint64(kind[i]), as_int[1], as_int[0]):  # _mix's step, per row
                row = (row ^ v) * np.uint64(_PRIME)
                row ^= row >> np.uint64(29)
            h[m] += row
            h2[m] += row * row + np.uint64(_GOLDEN)
    return h, h2


@njit(cache=True, nogil=True)
def _loose_pairs(dm, src_dev, cons_dev, anchor):
    """(low, high) machine pairs of the transfers between two different machines, neither an anchor."""
    loose = np.zeros(len(src_dev), dtype=np.bool_)
    for i in range(len(src_dev)):
        a, b = dm[src_dev[i]], dm[cons_dev[i]]
        loose[i] = a != b and not anchor[a] and not anchor[b]
    rows = np.flatnonzero(loose)
    pairs = np.empty((len(rows), 2), dtype=np.int64)
    for k in range(len(rows)):
        a, b = dm[src_dev[rows[k]]], dm[cons_dev[rows[k]]]
        pairs[k, 0], pairs[k, 1] = min(a, b), max(a, b)
    return pairs


@njit(cache=True, nogil=True)
def _kept(dm, src_dev, cons_dev, rep_of, anchor, represented):
    """The transfers between representative machines; the real transfers each stands for (the dropped
    machines on its non-anchor side), how many of those land on its consumer's device (an anchor's device
    receives the dropped machines' transfers too: their buffers count in its memory) and how many leave its
    source's device (an anchor sends to every dropped machine)."""
    keep = np.zeros(len(src_dev), dtype=np.bool_)
    for i in range(len(src_dev)):
        a, b = dm[src_dev[i]], dm[cons_dev[i]]
        keep[i] = rep_of[a] == a and rep_of[b] == b
    rows = np.flatnonzero(keep)
    weight, landing, sending = np.empty(len(rows)), np.empty(len(rows)), np.empty(len(rows))
    for k in range(len(rows)):
        a, b = dm[src_dev[rows[k]]], dm[cons_dev[rows[k]]]
        weight[k] = represented[b] if anchor[a] else represented[a]
        landing[k] = represented[a] if anchor[b] else 1
        sending[k] = represented[b] if anchor[a] else 1
    return keep, weight, landing, sending
