"""The check of `measured_step`: the measured step lies within 25% of its prediction; a WARN, not an error.

It runs inside the asset, on the row just stored. A prediction off by more than the threshold says the
cost model misjudges this plan on this runtime (recalibrate, or look at the terms), not that the plan is
broken, so it warns. When nothing was measured (a topology this machine cannot run) it passes with
`ran: False` and the reason, as `graph_matches_single_device` does for models too big to run.
"""

from __future__ import annotations

from typing import Any

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec

from tag_core.runtime.measure import step_error

CHECK = "measured_step_near_prediction"
THRESHOLD = 0.25  # |measured - predicted| / measured above this warns
STEP_CHECK = AssetCheckSpec(CHECK, asset="measured_step",
                            description=f"The measured step (median of the timed steps) is within {THRESHOLD:.0%} of "
                                        "the simulator's prediction, |measured - predicted| / measured; warns "
                                        "otherwise.")


def step_check(row: dict[str, Any] | None, not_measured: str | None = None) -> AssetCheckResult:
    """The check's result for a `measured_steps` row (None: not measured, because `not_measured`)."""
    if row is None:
        return AssetCheckResult(check_name=CHECK, passed=True, severity=AssetCheckSeverity.WARN,
                                metadata={"ran": False, "reason": f"not measured: {not_measured}"})
    error = step_error(row)
    metadata: dict[str, Any] = {"ran": True, "measured_ms": row["measured_s"] * 1e3,
                                "threshold_pct": THRESHOLD * 100}
    if row.get("spread_s") is not None:
        metadata["spread_ms"] = row["spread_s"] * 1e3
    if error is None:
        metadata["reason"] = "no prediction to compare: the emission folder records none"
        return AssetCheckResult(check_name=CHECK, passed=True, severity=AssetCheckSeverity.WARN, metadata=metadata)
    metadata.update(predicted_ms=row["predicted_s"] * 1e3, error_pct=error * 100)
    passed = abs(error) <= THRESHOLD
    direction = "low" if error < 0 else "high"
    metadata["verdict"] = (f"predicted within {THRESHOLD:.0%} ({error:+.1%})" if passed else
                           f"prediction {abs(error):.1%} too {direction}: over the {THRESHOLD:.0%} threshold")
    return AssetCheckResult(check_name=CHECK, passed=passed, severity=AssetCheckSeverity.WARN, metadata=metadata)
