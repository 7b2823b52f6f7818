"""How long a measurement warms up before its timed steps.

A fresh server's first steps run slow: on one pinned core, mlp's step at batch 128 took 4.3 ms (the median of
the 20 steps after 3 of warm-up) against 3.4 ms from step 20 on. So a measurement warms up for a while as
well as for a few steps: a big model's few slow steps pass the time, a small model's many fast ones the count.
"""

from __future__ import annotations

WARMUP_STEPS, WARMUP_SECONDS, MAX_WARMUP_STEPS = 3, 1.0, 50


def still_warming(done: int, elapsed_s: float, least: int, seconds: float) -> bool:
    """Whether the next step is warm-up: fewer than `least` are done, or fewer than MAX_WARMUP_STEPS in under
    `seconds`."""
    return done < least or (done < MAX_WARMUP_STEPS and elapsed_s < seconds)
