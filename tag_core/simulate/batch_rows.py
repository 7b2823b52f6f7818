"""Whole rows of the batch per replica: TF splits a batch by rows, so a group's devices compute integer
sub-batches, and a device whose share rounds to no row runs no replica (the emitter gives it none)."""

from __future__ import annotations

import numpy as np


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
