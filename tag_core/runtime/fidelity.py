"""`tag fidelity`'s experiment: predict, emit, run and measure each strategy; predicted against measured.

Each strategy goes end to end: the simulator predicts its step (with the topology's stored calibration
applied), the emitter builds its graph with CPU devices, and the graphs run here on one pinned single-core
TF server process per task, interleaved (tag_core.runtime.interleave) so that a change in the machine's load
hits every strategy alike. Each timed strategy's median step, interquartile range and prediction go into
`measured_steps` under its name. A `MeasurementWindow` may profile and calibrate again between the rounds;
the report then predicts from what was measured there, and keeps the prediction before as
predicted_before_s.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .fidelity_report import summarise
from .measurement_window import MeasurementWindow

if TYPE_CHECKING:
    from tag_core.cluster.topology import Topology
    from tag_core.emit.emission import Emission

PROFILE_RUNS = 5  # recorded runs of a profile; with profile_after, spread over the window's profiles


@dataclass(frozen=True)
class FidelitySettings:
    """What `tag fidelity`'s flags choose (see its --help)."""

    strategies: tuple[str, ...]
    steps: int
    warmup: int
    rounds: int
    budget_iterations: int
    timeout: float
    profile_after: bool
    calibrate_after: bool
    drift_check: bool = True  # profile once after the measurement and compare (MeasurementWindow.drift)


def measure_fidelity(model: str, batch_size: int | None, model_timeout, topology: Topology,
                     settings: FidelitySettings, db: str | None, echo: Callable[[str], None]) -> dict:
    """Every strategy of `settings` predicted, emitted, measured and stored: the report (`summarise`, with the
    rounds, the measured error the TAG plan weighed, the window's measurements and the wall time)."""
    from tag_core.capture.models import resolve_model

    spec = resolve_model(model, batch_size, model_timeout)
    own, _, profiles, comm, uncalibrated, error = _inputs(model, model_timeout, spec, topology, db, echo)
    if uncalibrated:
        echo(f"warning: predictions without a calibration: {uncalibrated}")
    if error is not None and "tag" in settings.strategies:
        echo(f"the TAG plan stays on one device unless it beats it by more than {error.describe()}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tag-fidelity-") as work:
        rows, folders, emissions = [], {}, {}
        for i, name in enumerate(settings.strategies, 1):
            row, folder, emission = _prepare(spec, topology, profiles, comm, uncalibrated, error, name,
                                             settings.budget_iterations, f"[{i}/{len(settings.strategies)}] {name}",
                                             Path(work) / name, echo)
            rows.append(row)
            if folder is not None:
                folders[name], emissions[name] = folder, emission
        window, drift = None, None
        if folders and (settings.profile_after or settings.calibrate_after or settings.drift_check):
            window = MeasurementWindow(own, profiles, topology, settings.profile_after, settings.calibrate_after,
                                       PROFILE_RUNS, settings.rounds, db, echo, drift_check=settings.drift_check)
        stored, bias = _measure(settings, rows, folders, echo, window) if folders else ({}, [])
        if window is not None:
            window()
            comm = window.comm() or comm
            drift = window.drift()
            after = settings.profile_after or bool(drift and drift["drifted"])
            if drift:
                echo(drift["text"])
            if after or settings.calibrate_after:
                _predict_again(rows, emissions, window.profiles if after else profiles, comm, uncalibrated)
        _store(db, rows, stored, comm.calibration_hash)
    report = summarise(rows, spec.name, topology.name, spec.batch_size, comm.calibration_hash, settings.steps,
                       settings.warmup)
    report["rounds"] = settings.rounds
    report["measured_error"] = error.to_dict() if error is not None else None  # what the TAG row's search weighed
    report.update(window.report() if window is not None else
                  {"profile_steps": None, "calibrations_during": None})
    report["drift"] = drift
    report["position_bias"] = bias
    report["wall_s"] = time.monotonic() - started
    return report


def _inputs(model: str, model_timeout, spec, topology, db: str | None, echo):
    """The model at its own batch (as captured), its graph, op profiles (profiling the batches the strategies
    use when missing), the communication model of the topology's calibration and its measured error."""
    from tag_core import store
    from tag_core.capture.models import resolve_model
    from tag_core.capture.steps import ensure_captured
    from tag_core.plan.measured_error import measured_error
    from tag_core.plan.planner import profile_batch_sizes
    from tag_core.profile.profiler import profile_model
    from tag_core.simulate.comm import comm_for

    own = resolve_model(model, timeout=model_timeout)  # captured at the model's own batch, as `tag plan` keeps it
    conn = store.connect(db)
    try:
        echo(f"capturing {spec.name}")
        graph = ensure_captured(conn, own)
        profiles = store.load_profiles(conn, own.name)
        have = set(profiles.batch_size.unique()) if not profiles.empty else set()
        missing = [b for b in profile_batch_sizes(spec.batch_size, topology) if b not in have]
        if missing:
            echo(f"profiling {own.name} at batch sizes {missing}")
            profile_model(conn, own, missing, runs=PROFILE_RUNS, warmup=2, show_progress=False)
            profiles = store.load_profiles(conn, own.name)
        comm, uncalibrated = comm_for(conn, topology)
        error = measured_error(conn, topology, comm.calibration_hash)
    finally:
        conn.close()
    return own, graph, profiles, comm, uncalibrated, error


def _predict_again(rows: list[dict], emissions: dict, profiles, comm, uncalibrated) -> None:
    from tag_core.emit.prediction import predict_emission

    for row in rows:
        if row["strategy"] in emissions:
            predicted = predict_emission(emissions[row["strategy"]], profiles, comm, uncalibrated)
            row["predicted_before_s"] = row["predicted_s"]
            row.update(_prediction_fields(predicted))


def _prepare(spec, topology, profiles, comm, uncalibrated, error, name: str, budget_iterations: int, label: str,
             folder: Path, echo) -> tuple[dict, Path | None, Emission | None]:
    """Build, predict and emit one strategy: its row, its folder and its emission (None, None when it could not
    be emitted)."""
    from tag_core.emit.graph_facts import graph_facts
    from tag_core.emit.prediction import emit_predicted
    from tag_core.errors import TagInputError
    from tag_core.plan.compared_strategies import build_strategy
    from tag_core.simulate.simulator import Simulator

    row = {"strategy": name, "predicted_s": None, "measured_s": None, "spread_s": None}

    def build(graph, topo):
        echo(f"{label}: {'searching a plan' if name == 'tag' else 'building the strategy'}")
        sim = Simulator(graph, topo, profiles, batch_size=spec.batch_size, comm=comm)
        return build_strategy(name, sim, profiles, budget_iterations, error)

    try:
        echo(f"{label}: emitting")
        emission, predicted = emit_predicted(spec, topology, build, folder, profiles, comm, uncalibrated)
    except (TagInputError, RuntimeError) as exc:  # a strategy the emitter cannot build: this row fails alone
        row["error"] = f"emit failed: {exc}"
        echo(f"{label}: {row['error']}")
        return row, None, None
    row.update(_prediction_fields(predicted))
    row["emitted"] = graph_facts(emission.emitted.graph_def, [emission.emitted.loss_tensor, emission.emitted.train_op])
    echo(f"{label}: predicted {row['predicted_s'] * 1e3:.2f} ms")
    return row, folder, emission


def _prediction_fields(predicted: dict) -> dict:
    return {"predicted_s": predicted["iteration_time_s"],
            "terms": {"busy_s": max(predicted["busy_s"]), **{k: v for k, v in predicted["comm_s"].items() if v}}}


def _measure(settings: FidelitySettings, rows: list[dict], folders: dict[str, Path], echo,
             between_rounds=None) -> tuple[dict[str, dict], list[dict]]:
    """Time every emitted strategy interleaved (calling `between_rounds` between rounds); fill in the rows.
    Returns the `measured_steps` row of each strategy timed (stored once the predictions are final: `_store`), and
    the steps' bias by place in the round (`position_bias`)."""
    from .interleave import measure_interleaved, position_bias
    from .measure import measured_step_row
    from .supervisor import check_folder

    names = list(folders)
    echo(f"measuring {len(names)} strategies interleaved: {settings.warmup} warm-up steps each, then "
         f"{settings.steps} timed steps each over {settings.rounds} rounds")
    outcomes = measure_interleaved([folders[n] for n in names], settings.steps, settings.warmup, settings.rounds,
                                   timeout=settings.timeout, echo=lambda line: echo(f"  {line}"),
                                   between_rounds=between_rounds)
    by_name = {r["strategy"]: r for r in rows}
    stored = {}
    for name, outcome in zip(names, outcomes):
        row, timing = by_name[name], outcome.timing
        if timing is None:
            row["error"] = outcome.error or "no step was timed"
            continue
        stored[name] = measured_step_row(check_folder(folders[name]), timing, strategy=name)
        row.update(measured_s=timing.median_s, spread_s=timing.spread_s, steps=timing.steps,
                   min_s=min(timing.seconds), max_s=max(timing.seconds))
        if outcome.stopped:  # a server died: the steps timed before stand, fewer than asked
            row["stopped"] = outcome.stopped
        echo(f"{name}: measured {timing.median_s * 1e3:.2f} ms (interquartile range {timing.spread_s * 1e3:.2f} ms), "
             f"predicted {row['predicted_s'] * 1e3:.2f} ms")
    return stored, position_bias(outcomes)


def _store(db: str | None, rows: list[dict], stored: dict[str, dict], calibration_hash: str | None) -> None:
    """Each timed strategy's `measured_steps` row, with the prediction the report gives (from the profiles
    and the calibration after the rounds with profile_after and calibrate_after)."""
    from .measure import save_measured_step

    for row in rows:
        if row["strategy"] in stored:
            save_measured_step({**stored[row["strategy"]], "predicted_s": row["predicted_s"],
                                "calibration_hash": calibration_hash}, db)
