"""Per-slot kernels over the usable CPUs.

The engine's per-slot passes (peak memory, local frees, chains) are compiled loops that release the GIL
(numba, nogil). A PS over hundreds of machines has hundreds of slots and millions of chain entries; there they
run in threads, over contiguous ranges of slots with about equal entries. Each range writes its own slots'
outputs only, so results do not depend on the number of threads.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

MIN_ENTRIES = 300_000  # below this many chain entries one thread: starting the others costs more than it saves
MAX_THREADS = 4

_pools: dict[int, ThreadPoolExecutor] = {}  # by process: a forked child makes its own


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def slot_ranges(lens: np.ndarray) -> list[tuple[int, int]]:
    """Contiguous (first, end) slot ranges of about equal entries, one per thread."""
    S = len(lens)
    threads = min(usable_cpus(), MAX_THREADS, S)
    total = int(lens.sum())
    if threads < 2 or total < MIN_ENTRIES:
        return [(0, S)]
    cuts = np.searchsorted(np.cumsum(lens), total * np.arange(1, threads) / threads, side="right")
    bounds = np.unique(np.concatenate([[0], cuts, [S]]))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def over_slots(kernel: Callable, lens: np.ndarray, *args) -> None:
    """kernel(first, end, *args) for ranges of slots that cover them all, side by side."""
    ranges = slot_ranges(lens)
    if len(ranges) == 1:
        kernel(0, len(lens), *args)
        return
    pool = _pools.get(os.getpid())
    if pool is None:
        pool = _pools[os.getpid()] = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="tag-slots")
    for future in [pool.submit(kernel, a, b, *args) for a, b in ranges]:
        future.result()
