"""Measured steps: timing an emitted graph after warm-up, the row `measured_steps` stores, and the
rank correlation `tag fidelity` reports. `measure_folder` measures one emission folder (`tag run
--measure`'s work, for the `measured_step` asset); `unmeasurable` says why a topology cannot be measured here.

A measured step time is the median of the timed steps (robust to the odd step a busy machine
stretches); its spread is their interquartile range (75th minus 25th percentile), which says how much
steps vary without letting one outlier decide. The prediction beside it is the one `tag emit`
recorded in the folder's plan.json ("prediction": the simulator on the emitted strategy, with the
topology's calibration applied when the store had one for that snapshot).
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .warmup import WARMUP_SECONDS, WARMUP_STEPS

if TYPE_CHECKING:
    from tag_core.cluster.topology import Topology

SPREAD = "interquartile range (75th - 25th percentile) of the timed steps"


@dataclass(frozen=True)
class StepTiming:
    """The timed steps of one run (seconds each, warm-up excluded)."""

    seconds: tuple[float, ...]

    @property
    def steps(self) -> int:
        return len(self.seconds)

    @property
    def median_s(self) -> float:
        return float(np.median(self.seconds))

    @property
    def q1_s(self) -> float:
        return float(np.percentile(self.seconds, 25))

    @property
    def q3_s(self) -> float:
        return float(np.percentile(self.seconds, 75))

    @property
    def spread_s(self) -> float:
        """The interquartile range (see SPREAD)."""
        return self.q3_s - self.q1_s

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "median_s": self.median_s, "spread_s": self.spread_s, "q1_s": self.q1_s,
                "q3_s": self.q3_s, "min_s": min(self.seconds), "max_s": max(self.seconds), "spread": SPREAD}


def step_timing(run) -> StepTiming | None:
    """The timing of a RunResult's steps after its warm-up (None when no step was timed)."""
    times = tuple(float(s["seconds"]) for s in run.measured_steps)
    return StepTiming(times) if times else None


def measure_emitted(folder: str | Path, steps: int, warmup: int = WARMUP_STEPS, timeout: float = 600.0,
                    servers: str = "auto", echo: Callable[[str], None] | None = None, cluster: str | None = None,
                    task_index: int = 0, warmup_s: float = WARMUP_SECONDS):
    """Run untimed steps (`warmup` at least, and more until `warmup_s` has passed: warmup.still_warming), then `steps`
    timed ones of an emission folder (on local servers, or as one task of `cluster`): (RunResult, StepTiming or
    None)."""
    from .supervisor import run_emitted

    result = run_emitted(folder, steps=steps, warmup=warmup, timeout=timeout, servers=servers, echo=echo,
                         cluster=cluster, task_index=task_index, warmup_s=warmup_s)
    return result, step_timing(result) if result.ok else None


def measured_step_row(plan: dict[str, Any], timing: StepTiming, strategy: str | None = None) -> dict[str, Any]:
    """A `measured_steps` row for an emission's plan.json and its timing; `strategy` names the row
    (default: the strategy's name in the plan)."""
    lineage = plan.get("lineage") or {}
    prediction = plan.get("prediction") or {}
    calibration = prediction.get("calibration") if prediction else lineage.get("calibration")
    return {"model": plan["model"], "topology": plan["topology"],
            "strategy": strategy or (plan.get("summary") or {}).get("strategy") or "plan",
            "plan_id": lineage.get("plan_id"), "graph_hash": lineage.get("graph_hash"),
            "topology_hash": lineage.get("topology_hash"), "calibration_hash": calibration,
            "batch_size": plan.get("batch_size"), "steps": timing.steps,
            "predicted_s": prediction.get("iteration_time_s"), "measured_s": timing.median_s,
            "spread_s": timing.spread_s, "host": socket.gethostname()}


class MeasureFailed(RuntimeError):
    """An emitted step that did not run to the end: one line, with the run's report in `lines`."""

    def __init__(self, message: str, lines: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.lines = list(lines)


@dataclass(frozen=True)
class MeasuredStep:
    """One measurement of an emission folder: its `measured_steps` row, the timing, where the tasks served."""

    row: dict[str, Any]
    timing: StepTiming
    servers: str
    warmup: int

    @property
    def predicted_s(self) -> float | None:
        return self.row["predicted_s"]

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured, None without a prediction."""
        return step_error(self.row)


def step_error(row: dict[str, Any]) -> float | None:
    """A `measured_steps` row's relative error (predicted - measured) / measured; None without a prediction."""
    from tag_core.plan.measured_error import relative_error  # here: tag_core.plan loads the planner and numba

    predicted, measured = row.get("predicted_s"), row.get("measured_s")
    if predicted is None or measured is None or not math.isfinite(predicted) or not measured > 0:  # NaN: none
        return None
    return relative_error(predicted, measured)


def unmeasurable(topology: Topology, cores: int | None = None) -> str | None:
    """Why a plan for `topology` cannot be measured here as it was predicted (None: it can).

    A measurement stands beside its prediction only when the devices are this machine's own: CPU
    machines of one device each (the topology `tag calibrate --local N` writes), each task a server
    pinned to a core of its own. GPU kernels run on a CPU core would measure the CPU, not the plan."""
    from .local_cluster import pinnable_cores

    kinds = sorted({m.gpu.name for m in topology.machines if m.gpu.name != "cpu"})
    if kinds:
        return (f"{topology.name} has {', '.join(kinds)} machines; measured here, CPU cores would stand in for "
                f"them: measure on the cluster (`tag run --measure --cluster`) or use a CPU topology "
                f"(`tag calibrate --local N`)")
    multi = [m.name for m in topology.machines if m.count != 1]
    if multi:
        return (f"{topology.name} has machines of more than one device ({', '.join(multi[:3])}); a measured task "
                f"runs one device, pinned to a core of its own")
    cores = len(pinnable_cores()) if cores is None else cores
    if topology.num_machines > cores:
        return (f"{topology.name} has {topology.num_machines} tasks, each pinned to a core of its own; this "
                f"process may use {cores} cores")
    return None


def measure_folder(folder: str | Path, steps: int, warmup: int = WARMUP_STEPS, timeout: float = 600.0,
                   servers: str = "auto", echo: Callable[[str], None] | None = None,
                   strategy: str | None = None) -> MeasuredStep:
    """Time `steps` steps of an emission folder after warm-up (`measure_emitted`): its `measured_steps` row beside
    the prediction its plan.json records (not stored: the caller holds the store). MeasureFailed when the
    run fails; TagInputError when `folder` is not an emission folder."""
    from .supervisor import check_folder

    plan = check_folder(folder)
    result, timing = measure_emitted(folder, steps, warmup, timeout=timeout, servers=servers, echo=echo)
    if timing is None:
        lines = [line.strip() for line in (result.error or "no step was timed").splitlines() if line.strip()]
        head = f"{lines[0]} {lines[-1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]  # + the cause
        raise MeasureFailed(f"the emitted step did not run: {head}", result.lines)
    return MeasuredStep(measured_step_row(plan, timing, strategy), timing, result.servers, warmup)


def save_measured_step(row: dict[str, Any], db: str | None = None) -> None:
    from tag_core import store

    conn = store.connect(db)
    try:
        store.save_measured_step(conn, row)
    finally:
        conn.close()


# ---------------------------------------------------------------- fidelity statistics


def average_ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n of `values`; tied values share the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation: Pearson's correlation of the average ranks. None when it is not
    defined (fewer than two pairs, or one side all tied)."""
    if len(x) != len(y):
        raise ValueError(f"spearman needs pairs: {len(x)} values against {len(y)}")
    if len(x) < 2:
        return None
    rx, ry = np.array(average_ranks(x)), np.array(average_ranks(y))
    dx, dy = rx - rx.mean(), ry - ry.mean()
    norm = math.sqrt(float(dx @ dx) * float(dy @ dy))
    return None if norm == 0 else float(dx @ dy) / norm


def tag_against_best(rows: Sequence[dict], name: str = "tag") -> dict[str, Any] | None:
    """Whether the row `name` measured no slower than the fastest other row, within the noise: the larger
    of the two rows' spreads (interquartile ranges). None without both."""
    tag = next((r for r in rows if r["strategy"] == name), None)
    others = [r for r in rows if r["strategy"] != name]
    if tag is None or not others:
        return None
    best = min(others, key=lambda r: r["measured_s"])
    noise = max(tag["spread_s"], best["spread_s"])
    margin = tag["measured_s"] - best["measured_s"]
    no_slower = margin <= noise
    verdict = "no slower within the noise" if no_slower else "SLOWER beyond the noise"
    text = (f"{name} measured {tag['measured_s'] * 1e3:.2f} ms against the fastest alternative, {best['strategy']} at "
            f"{best['measured_s'] * 1e3:.2f} ms: {margin * 1e3:+.2f} ms ({margin / best['measured_s']:+.1%}); noise "
            f"(the larger interquartile range) {noise * 1e3:.2f} ms: {verdict}")
    return {"best_alternative": best["strategy"], "tag_s": tag["measured_s"], "best_s": best["measured_s"],
            "margin_s": margin, "noise_s": noise, "no_slower_within_noise": no_slower, "text": text}
