"""Decisions on paired measurements: a fusion is kept when the median of its paired gains clears the margin
and a distribution-free confidence interval of that median excludes no gain at all. A median alone flips
with the noise from run to run (`tag fuse --measure` kept no pattern in one run and six in the next); the
interval only clears when the gain outlasts the spread."""

from __future__ import annotations

import math

CONFIDENCE = 0.9


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(low, median, high): the median of `values` and the order statistics that bound it with `confidence`,
    from the binomial distribution of how many values fall below the true median. Too few values for
    `confidence` give infinite bounds."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        raise ValueError("no values")
    median = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    tail, below, rank = (1 - confidence) / 2, 0.0, 0  # rank: values left outside on each side
    while rank < n // 2:
        below += math.comb(n, rank) / 2 ** n
        if below > tail:
            break
        rank += 1
    if rank == 0:
        return -math.inf, median, math.inf
    return ordered[rank - 1], median, ordered[n - rank]
