"""Timing simulations without numba's compiling.

The simulator's kernels compile the first time each runs in a process without numba's cache
(the first plan after an install, a fresh clone): seconds, where a simulation takes milliseconds. A
deadline that priced the work after the search from such a time held back more than the budget had
left, and the first `tag plan --budget-seconds 10` on 1024 machines searched for no iteration at all.
`Stopwatch` subtracts the compiling done meanwhile (numba's "numba:compile" events, outermost only).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from numba.core import event


class _CompileClock(event.Listener):
    """Total seconds numba has spent compiling in this process, nested compilations counted once."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._depth = 0
        self._started = 0.0
        self._lock = threading.Lock()

    def on_start(self, _event) -> None:
        with self._lock:
            if self._depth == 0:
                self._started = time.perf_counter()
            self._depth += 1

    def on_end(self, _event) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self.total_s += time.perf_counter() - self._started

    def seconds(self) -> float:
        with self._lock:
            running = time.perf_counter() - self._started if self._depth else 0.0
            return self.total_s + running


_COMPILING = _CompileClock()
event.register("numba:compile", _COMPILING)


def compile_seconds() -> float:
    """Seconds numba has spent compiling in this process so far."""
    return _COMPILING.seconds()


class Stopwatch:
    """Wall seconds since it was made (by `clock`), less what numba spent compiling meanwhile."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._wall = clock()
        self._compiling = compile_seconds()

    def seconds(self) -> float:
        compiled = compile_seconds() - self._compiling
        return max(self._clock() - self._wall - compiled, 0.0)
