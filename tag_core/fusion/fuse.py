"""`fuse_model`: the fusion stage in one call (`tag fuse` and the `fusion_plan` asset)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tag_core.capture.steps import load_step

from .patterns import plan_fusion
from .step_check import check_step, step_fetches
from .tune import step_values, tune_plan


def fuse_model(spec, graph, step_file: str, gpu, tune: bool = False, measure: bool = False, steps: int = 10,
               progress: bool = False, regions: bool = True):
    """Plan fusion for a captured model; optionally tune it (per pattern, per library call when `regions`, then
    the whole step) and time the step in every mode."""
    step = load_step(step_file)
    graph_def = step.graph_def
    plan = plan_fusion(graph, graph_def, gpu)
    if tune:
        plan = tune_plan(plan, graph_def, step_fetches(step), progress=progress,
                         values=lambda names: step_values(step, spec, names), regions=regions)
        plan = check_step(plan, step, spec)
    if measure:
        from .measure import measure_modes

        with tempfile.TemporaryDirectory() as folder:
            plan_file = Path(folder) / "fusion.json"
            plan_file.write_text(json.dumps(plan.to_json()))
            modes = measure_modes(spec.name, spec.batch_size, step_file, str(plan_file), steps=steps)
        plan.measured["step_ms"] = {mode: result["step_ms"] for mode, result in modes.items()}
        plan.measured["kernels_per_step"] = {mode: result["kernels"] for mode, result in modes.items()}
    return plan
