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

from .expand import transfer_durations
from .units import Transfers

HASH_BLOCK = 1 << 18  # transfers hashed at a time
MAX_COVER_ROUNDS = 32  # greedy rounds of pinning machines; what is left after them is pinned whole


@dataclass
class Slots:
    dev: np.ndarray  # representative device of each slot
    of_dev: np.ndarray  # slot of each device
    size: np.ndarray  # devices per slot
    keep: np.ndarray | None = None  # transfers the engine simulates (None: all)
    weight: np.ndarray | None = None  # per kept transfer: how many real transfers it stands for
    landing: np.ndarray | None = None  # per kept transfer: how many of those land on its consumer's device


def make_slots(ctx, p, t: Transfers, machines: bool = True) -> Slots:
    D = ctx.num_devices
    touched = np.zeros(D, dtype=bool)
    touched[t.src_dev] = True
    touched[t.cons_dev] = True
    touched[p.single_dev[p.single_dev >= 0]] = True
    if not getattr(ctx, "collapse", True):
        touched[:] = True
    eff, keep, weight, landing = np.arange(D), None, None, None
    if machines and getattr(ctx, "collapse", True) and len(t.cons_op) and getattr(ctx, "machine_class", None) is not None:
        eff, keep, weight, landing = _machine_collapse(ctx, p, t, touched)
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
    return Slots(reps, of_dev, np.bincount(of_dev, minlength=len(reps)), keep, weight, landing)


def _machine_collapse(ctx, p, t: Transfers, touched: np.ndarray):
    """(representative device per device, transfers kept, their weights, landing counts); see the module
    docstring."""
    dm, M = ctx.dev_machine, ctx.topology.num_machines
    machine = np.int32 if M < 2**31 else np.int64  # millions of transfers on thousands of GPUs
    src_m, dst_m = dm[t.src_dev].astype(machine), dm[t.cons_dev].astype(machine)
    anchor = np.zeros(M, dtype=bool)
    anchor[dm[p.single_dev[p.single_dev >= 0]]] = True
    # Traffic between two machines neither of which is an anchor: pin a small set of machines that covers
    # every such pair (greedy, the machines with the most partners first: one machine feeding a group on all
    # the others, or a few machines feeding a group on many), so the many on the other side still collapse.
    loose = ~anchor[src_m] & ~anchor[dst_m] & (src_m != dst_m)
    if loose.any():
        pairs = np.unique(np.column_stack([np.minimum(src_m, dst_m), np.maximum(src_m, dst_m)])[loose], axis=0)
        for _ in range(MAX_COVER_ROUNDS):
            partners = np.bincount(pairs.ravel(), minlength=M)
            anchor[partners == partners.max()] = True
            pairs = pairs[~anchor[pairs[:, 0]] & ~anchor[pairs[:, 1]]]
            if not len(pairs):
                break
        anchor[pairs.ravel()] = True
    start = ctx.machine_first_device
    # A multiset fingerprint of each machine's transfers: two sums of a per-row hash (order-free).
    h = np.zeros(M, dtype=np.uint64)
    h2 = np.zeros(M, dtype=np.uint64)
    # In blocks of transfers: a PS on thousands of GPUs has millions, and each hash step is a temporary per row
    # (wrapping sums: the blocks add up to the same fingerprints).
    for lo in range(0, len(t.cons_op), HASH_BLOCK):
        b = slice(lo, lo + HASH_BLOCK)
        dur = np.round(transfer_durations(ctx, t, b) * 1e12)
        sm, dm_, sd, cd = src_m[b], dst_m[b], t.src_dev[b], t.cons_dev[b]
        for side, m, mine, other_m, other in ((0, sm, sd - start[sm], dm_, cd), (1, dm_, cd - start[dm_], sm, sd)):
            other_id = np.where(other_m == m, -1 - (other - start[other_m]), other)  # inside: by local index
            row = _mix(side, mine, other_id, t.src_op[b], t.cons_op[b], t.kind[b], t.nbytes[b].round(), dur)
            np.add.at(h, m, row)
            np.add.at(h2, m, row * row + np.uint64(0x9E3779B97F4A7C15))
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
        return eff, None, None, None
    represented = np.bincount(rep_of, minlength=M)
    keep = (rep_of[src_m] == src_m) & (rep_of[dst_m] == dst_m)
    weight = np.where(anchor[src_m], represented[dst_m], represented[src_m]).astype(np.float64)[keep]
    # An anchor's device receives the dropped machines' transfers too (their buffers count in its memory).
    landing = np.where(anchor[dst_m], represented[src_m], 1).astype(np.float64)[keep]
    return eff, keep, weight, landing


def _mix(*cols) -> np.ndarray:
    """A 64-bit hash per row of the columns (wrapping multiply-xor; floats by their bits)."""
    n = next(len(c) for c in cols if np.ndim(c))
    out = np.full(n, 0xCBF29CE484222325, dtype=np.uint64)
    prime = np.uint64(0x100000001B3)
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
