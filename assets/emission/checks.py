"""The check of `distributed_graph`: the emitted step, run on local TF servers, computes the single-device step.

It runs inside the asset, right after emission, on the folder just written; models too big
to run here pass with `ran: False` and the reason.
"""

from __future__ import annotations

from pathlib import Path

from dagster import AssetCheckResult, AssetCheckSpec, AssetExecutionContext, MetadataValue

from tag_core.emit import Emission
from tag_core.runtime import run_emitted

from .config import EmitConfig

CHECK = "graph_matches_single_device"
GRAPH_CHECK = AssetCheckSpec(CHECK, asset="distributed_graph",
                             description="Run on local TF servers, the emitted step computes the single-device "
                                         "step: loss and every variable within 1e-4 (small models only).")


def graph_check(emission: Emission, out: Path, config: EmitConfig, context: AssetExecutionContext) -> AssetCheckResult:
    """Run the emitted step with --check when it is small enough to run here; otherwise say why not."""
    parameter_bytes = emission.graph.parameter_bytes
    ops = len(emission.emitted.graph_def.node)
    too_big = (f"{parameter_bytes / 2**20:.0f} MiB of parameters (limit {config.check_max_parameter_bytes / 2**20:.0f})"
               if parameter_bytes > config.check_max_parameter_bytes else
               f"{ops} ops (limit {config.check_max_ops})" if ops > config.check_max_ops else None)
    if too_big:
        return AssetCheckResult(check_name=CHECK, passed=True,
                                metadata={"ran": False, "reason": f"not run here: {too_big}"})
    result = run_emitted(out, steps=config.check_steps, check=True, timeout=config.check_timeout_s,
                         echo=context.log.info, rewrites=config.check_rewrites)
    metadata = {"ran": True, "steps": len(result.steps), "report": MetadataValue.md("\n".join(
        f"    {line}" for line in result.lines))}
    if result.max_relative_difference is not None:
        metadata["max_relative_difference"] = result.max_relative_difference
    if result.reference:
        metadata["reference"] = result.reference
    if result.check_skipped:
        metadata["check_skipped"] = result.check_skipped
    if result.seconds_per_step is not None:
        metadata["seconds_per_step"] = result.seconds_per_step
        metadata["graph_rewrites"] = config.check_rewrites
    return AssetCheckResult(check_name=CHECK, passed=result.ok, metadata=metadata)
