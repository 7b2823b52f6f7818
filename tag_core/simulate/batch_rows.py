"""Whole rows of the batch per replica: TF splits a batch by rows, so a group's devices compute integer
sub-batches, and a device whose share rounds to no row runs no replica (the emitter gives it none)."""

from __future__ import annotations

import heapq
from typing import Callable

import numpy as np

NO_ROWS_SHARE = 1e-6  # balanced_shares: the share, in rows, of a device it leaves without rows
BALANCED_MAX_ROWS = 16  # balanced_shares: the most rows on a device it considers


def split_batch(batch: int, shares: np.ndarray, speed: np.ndarray) -> np.ndarray:
    """Integer rows per device in proportion to `shares`, summing to `batch`: the rows left after rounding down
    go to the largest remainders; among equal ones to the fastest device (`speed`, so that the split does not
    depend on the order machines are listed in), then to the earlier one."""
    shares = np.asarray(shares, dtype=np.float64)
    exact = shares / shares.sum() * batch
    rows = np.floor(exact).astype(np.int64)
    short = batch - int(rows.sum())
    if short > 0:
        rows[np.lexsort((np.arange(len(rows)), -np.asarray(speed, dtype=np.float64), rows - exact))[:short]] += 1
    return rows


def balanced_rows(batch: int, device_type: np.ndarray, speed: np.ndarray, step_time: Callable[[int, int], float],
                  max_rows: int | None = None) -> np.ndarray | None:
    """Whole rows per device that finish the slowest replica's compute first: each next row goes where it ends
    soonest, `step_time(type, rows)` being a device of that type's step at that many rows. A per-op fixed cost
    makes this differ from a split by speed, and a device whose first row would end last gets none. Devices of
    one type get rows as even as whole rows allow (the spare to the earlier one); among equal times the row goes
    to the device with fewer rows (times flat at a launch floor spread the batch), then the faster (`speed`),
    then the earlier type. None when some device would get more than `max_rows`."""
    device_type = np.asarray(device_type, dtype=np.int64)
    types, first, count = np.unique(device_type, return_index=True, return_counts=True)
    given = np.zeros(len(types), dtype=np.int64)
    heap = [(step_time(int(t), 1), 1, -float(speed[f]), k) for k, (t, f) in enumerate(zip(types, first))]
    heapq.heapify(heap)
    left = batch
    while left:
        _, level, neg_speed, k = heapq.heappop(heap)
        if max_rows is not None and level > max_rows:
            return None
        # Every device of the type still below `level` ends its next row at the same time: all of them in turn.
        take = min(int(count[k] - given[k] % count[k]), left)
        given[k] += take
        left -= take
        level = int(given[k] // count[k]) + 1
        heapq.heappush(heap, (step_time(int(types[k]), level), level, neg_speed, k))
    rows = np.zeros(len(device_type), dtype=np.int64)
    for k, t in enumerate(types.tolist()):
        devices = np.flatnonzero(device_type == t)
        rows[devices] = given[k] // count[k]
        rows[devices[:given[k] % count[k]]] += 1
    return rows


class RowSplits:
    """`split_batch` of a group's devices, remembered per (mask, shares): a search reuses a few masks under
    one set of shares, and on 8192 GPUs each split sorts 8192 remainders."""

    KEPT = 64

    def __init__(self, batch: int, speed: np.ndarray):
        self.batch, self.speed = batch, speed
        self._kept: dict[tuple[bytes, bytes], np.ndarray] = {}

    def __call__(self, mask: np.ndarray, shares: np.ndarray, devices: np.ndarray) -> np.ndarray:
        """Rows of `devices` (the mask's devices with a positive share)."""
        key = (mask.tobytes(), shares.tobytes())
        rows = self._kept.get(key)
        if rows is None:
            if len(self._kept) >= self.KEPT:
                self._kept.clear()
            rows = self._kept[key] = split_batch(self.batch, shares[devices], self.speed[devices])
        return rows


def balanced_shares(sim, speed: np.ndarray) -> np.ndarray | None:
    """Batch shares of `balanced_rows` over all of `sim`'s devices, by its compute model: over every device
    they split into exactly those rows. A device left without rows keeps a token share (NO_ROWS_SHARE rows),
    which rounds to no row beside the others, so that a group on its machines alone still has devices. None
    past BALANCED_MAX_ROWS rows on a device: there fixed costs are small beside the rows' work, and the split
    by speed (measured at an even share) balances as well; each level costs the compute model a table."""
    types, first = np.unique(sim.dev_gpu_id, return_index=True)
    gpu_of = dict(zip(types.tolist(), (sim.dev_gpu[int(d)] for d in first)))

    def step_time(gpu_type: int, rows: int) -> float:
        return float(sim.compute.times(gpu_of[gpu_type], rows).sum())

    rows = balanced_rows(sim.batch, sim.dev_gpu_id, speed, step_time, max_rows=BALANCED_MAX_ROWS)
    return None if rows is None else np.where(rows > 0, rows, NO_ROWS_SHARE) / sim.batch
