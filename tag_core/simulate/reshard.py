"""Large batch re-slicings as collective units, costed per machine pair.

A tensor split over one set of devices and wanted (sliced differently, or whole) on another set moves as
point-to-point pieces, one per overlapping (source, destination) device pair. Between placements of
thousands of devices that is millions of pieces per step (a whole-batch copy on 5000 GPUs gathering from
2000), more than a planner can simulate thousands of times. Beyond MAX_P2P_ROWS pieces per edge the move
is one unit per tensor instead: the pieces between two machines share their channel and go one after the
other, channels run in parallel, so the unit takes as long as its busiest machine pair. Likewise any move
of more than MAX_UNIT_ROWS pieces (`rows_units`). Small topologies (testbed, cloud: at most 32 GPUs, so at
most 992 pieces per edge) keep the exact point-to-point model.
"""

from __future__ import annotations

import numpy as np

from .units import GATHER, NORMAL, P2P, PUSH, SPLIT, Collectives

MAX_P2P_ROWS = 4096  # (source, destination) device pairs per edge beyond which a re-slicing is one unit per tensor
MAX_UNIT_ROWS = 1024  # pieces per edge beyond which any move but a PS push is one unit per tensor (rows_units)


def is_large(src, dst, batch: bool, mode: int) -> bool:
    return mode == NORMAL and batch and src[0] == SPLIT and len(src[1]) * len(dst[1]) > MAX_P2P_ROWS


def too_many_rows(rows: np.ndarray, mode: int) -> bool:
    return len(rows) > MAX_UNIT_ROWS and mode != PUSH


def devices_of(ctx, *groups: np.ndarray) -> np.ndarray:
    """The distinct devices of `groups`, sorted (marked over the cluster: cheaper than sorting thousands)."""
    mark = np.zeros(ctx.num_devices, dtype=bool)
    for devices in groups:
        mark[devices] = True
    return np.flatnonzero(mark)


def _machine_intervals(ctx, devs: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """(machines, interval start, interval end, devices) per machine: a group's devices are in device
    order, so each machine's slices are contiguous."""
    machines, inv, count = np.unique(ctx.dev_machine[devs], return_inverse=True, return_counts=True)
    m_lo = np.full(len(machines), np.inf)
    m_hi = np.zeros(len(machines))
    np.minimum.at(m_lo, inv.reshape(-1), lo)
    np.maximum.at(m_hi, inv.reshape(-1), hi)
    return machines, m_lo, m_hi, count


def reshard_units(ctx, edges: np.ndarray, src, dst) -> Collectives:
    _, s_devs, s_lo, s_hi, _ = src
    d_kind, d_devs, d_lo, d_hi, _ = dst
    tensors, unit_of_edge = np.unique(ctx.e_src[edges], return_inverse=True)
    nbytes = np.zeros(len(tensors))
    np.maximum.at(nbytes, unit_of_edge, ctx.e_bytes[edges])
    sa, a_lo, a_hi, a_n = _machine_intervals(ctx, s_devs, s_lo, s_hi)
    whole = d_kind != SPLIT
    if whole:  # every destination device takes every source machine's slice
        db, _, _, b_n = _machine_intervals(ctx, d_devs, np.zeros(len(d_devs)), np.ones(len(d_devs)))
        frac = (a_hi - a_lo)[:, None] * b_n[None, :]
        pieces = a_n[:, None] * b_n[None, :]
    else:
        db, b_lo, b_hi, b_n = _machine_intervals(ctx, d_devs, d_lo, d_hi)
        frac = np.maximum(np.minimum(a_hi[:, None], b_hi[None, :]) - np.maximum(a_lo[:, None], b_lo[None, :]), 0.0)
        pieces = np.where(frac > 1e-12, np.minimum(a_n[:, None], b_n[None, :]), 0)
    chan = ctx.dev_channel_m[np.ix_(sa, db)]
    lat = np.where(frac > 1e-12, ctx.channel_latency[chan] * pieces, 0.0).ravel()
    per_byte = (frac / ctx.channel_bps[chan]).ravel()
    duration = (lat[None, :] + nbytes[:, None] * per_byte[None, :]).max(axis=1)
    U = len(tensors)
    devs = devices_of(ctx, s_devs, d_devs)
    return Collectives(np.full(U, GATHER if whole else P2P), nbytes, duration, [()] * U, [devs] * U, tensors,
                       np.arange(U), ctx.e_dst[edges], unit_of_edge)


def rows_units(ctx, edges: np.ndarray, rows: np.ndarray) -> Collectives:
    """The pieces `rows` (src_dev, dst_dev, fraction, kind) of every edge in `edges` as one unit per tensor:
    pieces on one channel go one after the other, channels in parallel (a fetch of a replicated tensor by
    thousands of devices, whose holders differ by rack, would otherwise be thousands of slots)."""
    tensors, unit_of_edge = np.unique(ctx.e_src[edges], return_inverse=True)
    nbytes = np.zeros(len(tensors))
    np.maximum.at(nbytes, unit_of_edge, ctx.e_bytes[edges])
    src, dst = rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64)
    channels, inv = np.unique(ctx.dev_channel[src, dst], return_inverse=True)
    inv = inv.reshape(-1)
    lat = np.bincount(inv, weights=ctx.channel_latency[channels][inv], minlength=len(channels))
    per_byte = np.bincount(inv, weights=rows[:, 2] / ctx.channel_bps[channels][inv], minlength=len(channels))
    duration = (lat[None, :] + nbytes[:, None] * per_byte[None, :]).max(axis=1)
    U = len(tensors)
    devs = devices_of(ctx, src, dst)
    return Collectives(np.full(U, int(rows[0, 3])), nbytes, duration, [()] * U, [devs] * U, tensors, np.arange(U),
                       ctx.e_dst[edges], unit_of_edge)
