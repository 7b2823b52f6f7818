"""The checks of `deployment_plan`: judged on the plan the asset just made, reported with its materialization."""

from __future__ import annotations

from dagster import AssetCheckResult, AssetCheckSpec, MetadataValue

PLAN_FITS_MEMORY = AssetCheckSpec("plan_fits_memory", asset="deployment_plan",
                                  description="No device runs out of memory under the plan (simulated).")
PLAN_BEATS_BASELINES = AssetCheckSpec("plan_beats_baselines", asset="deployment_plan",
                                      description="TAG is no slower than DP-NCCL and DP-NCCL-P (simulated).")
PLAN_CHECKS = [PLAN_FITS_MEMORY, PLAN_BEATS_BASELINES]


def plan_check_results(data: dict) -> list[AssetCheckResult]:
    """Both checks' results for a plan (`Plan.to_dict()`)."""
    tag = data["tag"]["iteration_time_s"]
    slower_than = [
        name for name in ("dp_nccl", "dp_nccl_p")
        if not data["baselines"][name].get("oom") and tag > data["baselines"][name]["iteration_time_s"] * (1 + 1e-9)
    ]
    return [
        AssetCheckResult(check_name=PLAN_FITS_MEMORY.name, passed=not data["oom"],
                         metadata={"peak_memory_bytes": MetadataValue.json(data["tag"].get("peak_memory_bytes"))}),
        AssetCheckResult(check_name=PLAN_BEATS_BASELINES.name, passed=not slower_than,
                         metadata={"tag_ms": tag * 1e3, "slower_than": ", ".join(slower_than) or "none",
                                   **{f"{name}_ms": data["baselines"][name]["iteration_time_s"] * 1e3
                                      for name in ("dp_nccl", "dp_nccl_p")}}),
    ]
