"""How far the cost model's predictions were from measured steps on a topology, and what the planner makes of it.

Every `tag run --measure` and `tag fidelity` stores a measured step beside its prediction (`measured_steps`).
Their median |error| on one topology snapshot, under the calibration the planner uses now, is what a
prediction there is worth: a distributed plan predicted to beat one device by less than that margin may well
lose in reality (on two local TF servers the errors ran to 15-30% and such plans measured slower than one
device; one predicted 11% faster with an 8% error measured 27% slower). So the planner keeps a distributed
plan only when it is predicted faster than one device even if both predictions are off by the margin in
opposite directions (planner step 8, plan/one_device.py); with fewer than MIN_STEPS measured steps there is
no margin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tag_core.cluster.topology import Topology

MIN_STEPS = 3  # fewer measured steps say too little about the model's error to overrule it


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured: negative when the prediction is low."""
    return (predicted - measured) / measured


def median_abs_error(pairs: Sequence[tuple[float, float]]) -> float | None:
    """The median |relative error| over (predicted, measured) pairs, None when there are none."""
    errors = [abs(relative_error(p, m)) for p, m in pairs]
    return float(np.median(errors)) if errors else None


@dataclass(frozen=True)
class MeasuredError:
    median_abs_error: float  # median |predicted - measured| / measured
    steps: int  # measured steps it is the median of
    calibration_hash: str | None  # the calibration their predictions used (None: the defaults)

    def describe(self) -> str:
        model = f"calibration {self.calibration_hash}" if self.calibration_hash else "the default cost model"
        return (f"the cost model's measured error on this topology, median |error| {self.median_abs_error:.0%} over "
                f"{self.steps} measured steps ({model})")

    def to_dict(self) -> dict:
        return {"median_abs_error": self.median_abs_error, "steps": self.steps,
                "calibration_hash": self.calibration_hash}


def measured_error(conn, topology: Topology, calibration_hash: str | None) -> MeasuredError | None:
    """The cost model's measured error on this snapshot of `topology` under `calibration_hash`; None with fewer
    than MIN_STEPS measured steps."""
    from tag_core import store

    pairs = store.predicted_and_measured(conn, topology.name, topology.content_hash(), calibration_hash)
    if len(pairs) < MIN_STEPS:
        return None
    return MeasuredError(median_abs_error(pairs), len(pairs), calibration_hash)
