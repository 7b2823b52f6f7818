"""Simulations are timed without numba's compiling: a first run after an install compiles the simulator's
kernels, and a deadline priced from that time held back more than the budget had left."""

from __future__ import annotations

import time

from numba import njit

from tag_core.simulate.stopwatch import Stopwatch, compile_seconds


def test_a_stopwatch_leaves_out_numba_compiling():
    @njit
    def fresh(x):  # a new function: it compiles at its first call, in this test
        return x * 2 + 1

    before, watch, started = compile_seconds(), Stopwatch(), time.perf_counter()
    assert fresh(3) == 7
    wall = time.perf_counter() - started
    compiled = compile_seconds() - before
    assert 0 < compiled <= wall
    assert watch.seconds() < wall - compiled / 2  # what is left is the call itself
    again = compile_seconds()
    assert fresh(4) == 9 and compile_seconds() == again  # compiled once


def test_a_stopwatch_without_compiling_is_the_wall_clock():
    before = time.perf_counter()
    watch = Stopwatch()
    after = time.perf_counter()
    sum(range(100_000))
    inner = time.perf_counter() - after
    assert inner <= watch.seconds() <= time.perf_counter() - before
