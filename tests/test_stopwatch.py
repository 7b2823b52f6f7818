"""Simulations are timed without numba's compiling: a first run after an install compiles the simulator's
kernels, and a deadline priced from that time held back more than the budget had left. The wall clock is
given as fixed readings, so nothing here depends on how fast the machine is."""

from __future__ import annotations

import pytest
from numba import njit

from tag_core.simulate.stopwatch import Stopwatch, compile_seconds


def readings(*values: float):
    return iter(values).__next__


def test_a_stopwatch_leaves_out_numba_compiling():
    @njit
    def fresh(x):  # a new function: it compiles at its first call, in this test
        return x * 2 + 1

    before = compile_seconds()
    watch = Stopwatch(clock=readings(0.0, 10.0))
    assert fresh(3) == 7
    compiled = compile_seconds() - before
    assert compiled > 0  # numba's compile events were seen
    assert watch.seconds() == pytest.approx(10.0 - compiled)
    again = compile_seconds()
    assert fresh(4) == 9 and compile_seconds() == again  # compiled once


def test_a_stopwatch_without_compiling_reads_the_clock():
    assert Stopwatch(clock=readings(1.0, 3.5)).seconds() == 3.5 - 1.0


def test_a_stopwatch_never_goes_below_zero():
    @njit
    def other(x):
        return x + 1

    watch = Stopwatch(clock=readings(5.0, 5.0))  # compiling took all the time the clock saw
    assert other(1) == 2
    assert watch.seconds() == 0.0
