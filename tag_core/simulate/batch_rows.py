"""Whole rows of the batch per replica: TF splits a batch by rows, so a group's devices compute integer
sub-batches, and a device whose share rounds to no row runs no replica (the emitter gives it none)."""

from __future__ import annotations

import numpy as np


def split_batch(batch: int, shares: np.ndarray, speed: np.ndarray | None = None) -> np.ndarray:
    """Integer rows per device in proportion to `shares`, summing to `batch`: the rows left after rounding down
    go to the largest remainders; among equal ones to the fastest device (`speed`, so that the split does not
    depend on the order machines are listed in), then to the earlier one."""
    shares = np.asarray(shares, dtype=np.float64)
    exact = shares / shares.sum() * batch
    rows = np.floor(exact).astype(np.int64)
    short = batch - int(rows.sum())
    if short > 0:
        fast = np.zeros(len(rows)) if speed is None else -np.asarray(speed, dtype=np.float64)
        rows[np.lexsort((np.arange(len(rows)), fast, rows - exact))[:short]] += 1
    return rows
