"""What the simulator predicts for an emitted step: plan.json's `prediction`, which `tag run --measure`,
`tag fidelity` and the measured_step asset set beside the measured step."""

from __future__ import annotations

import copy
from typing import Any

from tag_core.simulate.comm import CommModel
from tag_core.simulate.simulator import Simulator

from .emission import Emission
from .emitter import emit
from .folder import write_emission
from .nodes import parse_input


def predict_emission(emission: Emission, profiles, comm: CommModel, uncalibrated: str | None) -> dict[str, Any]:
    """The simulator on the emitted strategy at the emitted batch, with `comm` (the topology's calibration,
    when one applies). SFB decisions are left out: the emitter builds every gradient's ordinary sync."""
    strategy = copy.copy(emission.strategy)
    left_out = len(strategy.sfb)
    strategy.sfb = {}
    statistics = statistic_ops(emission)
    sim = Simulator(emission.graph, emission.topology, profiles, batch_size=emission.batch_size, comm=comm,
                    statistics=statistics)
    result = sim.run(strategy)
    return {"iteration_time_s": float(result.iteration_time_s), "oom": bool(result.oom),
            "calibration": comm.calibration_hash, "uncalibrated_because": uncalibrated,
            "profiled_types": sim.compute.profiled_types, "batch_size": sim.batch,
            "busy_s": [float(b) for b in result.busy_s], "comm_s": {k: float(v) for k, v in result.comm_s.items()},
            **({"sfb_left_out": left_out} if left_out else {}),
            **({"statistics_summed": len(statistics)} if statistics else {})}


def emit_predicted(spec, topology, strategy, out, profiles, comm: CommModel, uncalibrated: str | None,
                   plan: dict[str, Any] | None = None, force: bool = False) -> tuple[Emission, dict[str, Any]]:
    """Emit `strategy` for CPU devices and write `out` with its prediction, as `tag emit --device-kind cpu`
    does: one emission and one prediction for `tag fidelity` and the measured_step asset."""
    emission = emit(spec, topology, strategy, "cpu", plan=plan, profiles=profiles)
    predicted = predict_emission(emission, profiles, comm, uncalibrated)
    write_emission(emission, out, force=force, prediction=predicted)
    return emission, predicted


def statistic_ops(emission: Emission) -> list[int]:
    """The OpGraph ops whose outputs the emitted graph all-reduces besides the gradients (batch statistics,
    tag_core.simulate.statistics). Fused gradient buckets are labelled "N gradients from ...", not a tensor."""
    gradients = {parse_input(v.gradient)[0] for v in emission.reference.variables if v.gradient}
    index = emission.graph.index
    sources = {parse_input(c.tensor)[0] for c in emission.emitted.collectives}
    return sorted(index[name] for name in sources - gradients if name in index)
