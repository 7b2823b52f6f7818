"""Planner step 8: the plan is `single`, and says why, when one device is as fast as the search's plan, or when
the plan's predicted gain could vanish within the cost model's measured error (tag_core.plan.measured_error).
Both predictions carry that error, so the plan stays only if it is faster still with its prediction that much
too low and one device's that much too high."""

from __future__ import annotations

from typing import Any

from tag_core.search.baselines import single
from tag_core.simulate.result import SimResult
from tag_core.simulate.simulator import Simulator

from .measured_error import MeasuredError


def one_device_instead(sim: Simulator, best: SimResult, dp: SimResult,
                       measured: MeasuredError | None) -> dict[str, Any] | None:
    """Step 8: `single` with why, when one device is no slower than the plan `best`, or, with a `measured` error
    m, when `best` is not faster by more than the gain 2m / (1 + m) that the error could take away (None
    otherwise)."""
    strategy = single(sim)
    result = sim.run(strategy)
    alone, margin = result.iteration_time_s, measured.median_abs_error if measured is not None else 0.0
    if result.oom or (not best.oom and best.iteration_time_s * (1 + margin) < alone * (1 - margin)):
        return None
    device = int(strategy.extra["device"])
    model = "calibrated" if sim.comm.calibrated else "default"
    why = (f"no distributed strategy beats one device under the {model} cost model: the search's best "
           f"{best.iteration_time_s * 1e3:.3g} ms{' (out of memory)' if best.oom else ''}, DP-NCCL "
           f"{dp.iteration_time_s * 1e3:.3g} ms, device {device} ({sim.dev_gpu[device].name}) alone "
           f"{alone * 1e3:.3g} ms")
    if not best.oom and best.iteration_time_s < alone:
        why += (f"; the best is {1 - best.iteration_time_s / alone:.0%} faster, within what "
                f"{measured.describe()} could take away ({2 * margin / (1 + margin):.0%})")
    strategy.extra["machines"] = [m.name for m in sim.topology.machines]
    return {"strategy": strategy, "result": result, "iteration_time_s": float(alone),
            "device": device, "why": why}
