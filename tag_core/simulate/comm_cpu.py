"""Communication its endpoints compute: the share of a transfer or collective that compute cannot hide.

A GPU moves data beside its kernels. A task that is one CPU core copies the bytes it sends and receives on
that core, so a step's transfers add to its compute: `tag calibrate` measures how much of moving 1 MB
tensors a compute chain hides (`CommModel.compute_overlap`; 1, all of it, unless measured). The unhidden
share of moving each transfer's bytes is work for both of its ends (its fixed latency is a wait, which
concurrent transfers share), and of each collective's whole time for every member (its steps are the
members' own reductions and messages: chained all-reduces and compute took their sum). The work is done
before the op that waits for it: that op starts at the later of (the device's previous op + the work) and
the arrival, so a device that waits for the data anyway loses nothing, and one that computes meanwhile is
delayed by it. A sender does its share after the op that made the tensor (before its next op).
"""

from __future__ import annotations

import numpy as np

from .chains import Chains


def charge_endpoints(ch: Chains, unhidden: float, tr_seconds: np.ndarray, src_slot: np.ndarray, src_k: np.ndarray,
                     cons_slot: np.ndarray, cons_k: np.ndarray, sending: np.ndarray, landing: np.ndarray,
                     d_slot: np.ndarray, d_k: np.ndarray, d_seconds: np.ndarray) -> None:
    """Adds the work to the chains' running sums (`ch.cum`), in place; `ch.dur` stays the ops' own time.

    `tr_seconds`: per transfer, the time its bytes take; `sending` / `landing`: per transfer, how many real
    transfers leave its source's / reach its consumer's device (symmetric machines collapsed); `d_*`: a
    collective's first consumer on each slot, and its time."""
    extra = np.zeros(len(ch.dur))
    if len(tr_seconds):
        np.add.at(extra, ch.base[cons_slot] + cons_k, tr_seconds * landing)
        after = src_k + 1
        sent = (src_k >= 0) & (after < ch.lens[src_slot])  # a last op's send has no op after it to delay
        np.add.at(extra, ch.base[src_slot[sent]] + after[sent], (tr_seconds * sending)[sent])
    if len(d_slot):
        np.add.at(extra, ch.base[d_slot] + d_k, d_seconds)
    running = np.cumsum(extra * unhidden)
    before_slot = np.concatenate([[0.0], running])[ch.base]
    ch.cum += running - np.repeat(before_slot, ch.lens)
