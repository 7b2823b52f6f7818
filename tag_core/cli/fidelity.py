"""`tag fidelity MODEL --topology FILE`: predict, emit, run and measure each strategy; predicted against measured.

Each strategy goes end to end: the simulator predicts its step (with the topology's stored calibration
applied), `tag emit` builds its graph with CPU devices, and the graphs run here on one pinned
single-core TF server process per task, interleaved so that a change in the machine's load hits every
strategy alike: after warm-up, each round runs every graph for one untimed and its share of the timed
steps. The median step time, its interquartile range and the prediction go into `measured_steps` under
the strategy's name. The order of the strategies predicted against measured gives Spearman's rank
correlation. With --profile-after the model is profiled again after each round, while the servers idle,
and with --calibrate-after the local tasks are calibrated again; the report predicts from what was measured
between and after the rounds (on a shared machine a step's speed and the runtime's fixed costs can move by
half within a minute: what was measured before may have caught another machine than the rounds did); each
row keeps its prediction from the profile and calibration before as predicted_before_s.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ._common import (
    add_model_timeout,
    non_negative_int,
    positive_float,
    positive_int,
    positive_int32,
    print_json,
    require,
)
from ._measurement_window import MeasurementWindow

if TYPE_CHECKING:
    from tag_core.emit.emission import Emission

DEFAULT_STRATEGIES = ("single", "dp-nccl", "dp-nccl-p", "horovod", "ps", "model_parallel", "duplicate", "mixed", "tag")
EXTRA = ("mixed", "tag")  # not names `tag simulate` knows: built here
MIXED_GROUPS = 8
PROFILE_RUNS = 5  # recorded runs of a profile; with --profile-after, spread over the window's profiles


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "fidelity", help="run strategies end to end here and compare predicted with measured step times",
        description=__doc__.split("\n\n")[1].replace("\n", " "))
    parser.add_argument("model", help="zoo name or path/to/file.py:function")
    parser.add_argument("--topology", required=True,
                        help="a topology of CPU machines to run here, as `tag calibrate --local N --out` writes it")
    parser.add_argument("--strategies", type=strategy_list, default=list(DEFAULT_STRATEGIES),
                        help="comma-separated: baselines (single, dp-nccl, dp-nccl-p, horovod), one option for every "
                             "op (allreduce, ps, duplicate, model_parallel), mixed (METIS groups taking the options "
                             "in turn on all machines, the first or the last) and tag (a fresh plan, MCTS with "
                             f"uniform priors, no SFB); default {','.join(DEFAULT_STRATEGIES)}")
    parser.add_argument("--batch-size", type=positive_int32, help="global batch (default: the model's)")
    parser.add_argument("--steps", type=positive_int, default=30, help="timed steps per strategy (default 30)")
    parser.add_argument("--warmup", type=non_negative_int, default=3,
                        help="untimed steps of each strategy before the first round (default 3)")
    parser.add_argument("--rounds", type=positive_int, default=5,
                        help="rounds the timed steps are spread over, every strategy in each (default 5)")
    parser.add_argument("--budget-iterations", type=positive_int, default=300,
                        help="MCTS iterations of the tag plan (default 300)")
    parser.add_argument("--timeout", type=positive_float, default=1800.0,
                        help="seconds the measurement of every strategy may take before it is stopped (default 1800)")
    parser.add_argument("--profile-after", action="store_true",
                        help="profile the model again after each round of the measurement and predict from those "
                             "profiles (the report keeps the predictions from the profile before as "
                             "predicted_before_s)")
    parser.add_argument("--calibrate-after", action="store_true",
                        help="calibrate this machine's tasks again after each round (as `tag calibrate --local N` "
                             "does) and predict with one calibration fitted to all of those samples, stored as the "
                             "topology's newest")
    add_model_timeout(parser, "--model-timeout")  # --timeout bounds the measurement here
    parser.add_argument("--json", action="store_true",
                        help='print {"rows": [{"strategy", "predicted_s", "measured_s", "spread_s", ...}], '
                             '"spearman", "median_abs_error", ...}')
    parser.set_defaults(run=run)


def strategy_list(text: str) -> list[str]:
    """Comma-separated strategy names, canonical and without repeats; ArgumentTypeError naming the unknown."""
    import argparse

    from tag_core.errors import TagInputError
    from tag_core.search.strategy_files import check_strategy_name

    names: list[str] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        key = part.lower()
        if key not in EXTRA:
            try:
                kind = check_strategy_name(part)
            except TagInputError:
                raise argparse.ArgumentTypeError(
                    f"unknown strategy {part!r}; known: single, dp-nccl, dp-nccl-p, horovod, allreduce, ps, "
                    f"duplicate, model_parallel, mixed, tag") from None
            key = key.replace("-", "_") if kind == "option" else key.replace("_", "-")
        if key not in names:
            names.append(key)
    if not names:
        raise argparse.ArgumentTypeError(f"must name at least one strategy, got {text!r}")
    return names


def _say(text: str) -> None:
    print(f"tag fidelity: {text}", file=sys.stderr, flush=True)


def run(args) -> int:
    from tag_core.capture.models import resolve_model
    from tag_core.cluster.topology_json import load_topology
    from tag_core.errors import TagInputError

    try:
        topology = load_topology(args.topology)
    except TagInputError as exc:  # named by the file: name the argument too
        raise TagInputError("--topology", f"{exc.where}: {exc.problem}") from None
    kinds = sorted({m.gpu.name for m in topology.machines})
    require(kinds == ["cpu"], "--topology", f"{topology.name} has {', '.join(kinds)} machines; fidelity runs "
                                            "here, on CPU tasks: use the topology `tag calibrate --local N` writes")
    spec = resolve_model(args.model, args.batch_size, args.model_timeout)
    batch = spec.batch_size
    own, graph, profiles, comm, uncalibrated, error = _inputs(args, spec, topology)
    if uncalibrated:
        _say(f"warning: predictions without a calibration: {uncalibrated}")
    if error is not None and "tag" in args.strategies:
        _say(f"the TAG plan stays on one device unless it beats it by more than {error.describe()}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tag-fidelity-") as work:
        rows, folders, emissions = [], {}, {}
        for i, name in enumerate(args.strategies, 1):
            row, folder, emission = _prepare(spec, topology, profiles, comm, uncalibrated, error, name,
                                             args.budget_iterations, f"[{i}/{len(args.strategies)}] {name}",
                                             Path(work) / name)
            rows.append(row)
            if folder is not None:
                folders[name], emissions[name] = folder, emission
        window = None
        if folders and (args.profile_after or args.calibrate_after):
            window = MeasurementWindow(args, own, profiles, topology, args.profile_after, args.calibrate_after,
                                       PROFILE_RUNS)
        stored = _measure(args, rows, folders, window) if folders else {}
        if window is not None:
            window()
            comm = window.comm() or comm
            _predict_again(rows, emissions, profiles if window.profiles is None else window.profiles, comm,
                           uncalibrated)
        _store(args, rows, stored, comm.calibration_hash)
    report = summarise(rows, spec.name, topology.name, batch, comm.calibration_hash, args.steps, args.warmup)
    report["rounds"] = args.rounds
    report["measured_error"] = error.to_dict() if error is not None else None  # what the TAG row's search weighed
    report.update(window.report() if window is not None else
                  {"profile_steps": None, "calibrations_during": None})
    report["wall_s"] = time.monotonic() - started
    if args.json:
        print_json(report)
    else:
        print(format_report(report))
    return 0 if all(r["measured_s"] is not None and not r.get("stopped") for r in rows) else 1


def _inputs(args, spec, topology):
    """The model at its own batch (as captured), its graph, op profiles (profiling the batches the strategies
    use when missing), the communication model of the topology's calibration and its measured error."""
    from tag_core import store
    from tag_core.capture.models import resolve_model
    from tag_core.capture.steps import ensure_captured
    from tag_core.plan.measured_error import measured_error
    from tag_core.plan.planner import profile_batch_sizes
    from tag_core.profile.profiler import profile_model
    from tag_core.simulate.comm import comm_for

    from ._common import open_store

    own = resolve_model(args.model, timeout=args.model_timeout)  # captured at the model's own batch, as `tag plan` keeps it
    conn = open_store(args)
    try:
        _say(f"capturing {spec.name}")
        graph = ensure_captured(conn, own)
        profiles = store.load_profiles(conn, own.name)
        have = set(profiles.batch_size.unique()) if not profiles.empty else set()
        missing = [b for b in profile_batch_sizes(spec.batch_size, topology) if b not in have]
        if missing:
            _say(f"profiling {own.name} at batch sizes {missing}")
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


def build_strategy(name: str, sim, profiles, budget_iterations: int, measured_error=None):
    """The strategy `name` on the simulator's graph and topology (see --strategies); the TAG plan weighs
    `measured_error` (tag_core.plan.measured_error)."""
    from tag_core.search.strategy_files import load_strategy

    if name == "mixed":
        return mixed_strategy(sim, profiles)
    if name == "tag":
        from tag_core.plan.planner import plan
        from tag_core.search.mcts import Budget

        planned = plan(sim.graph, sim.topology, profiles, batch_size=sim.batch, budget=Budget(iterations=budget_iterations),
                       comm=sim.comm, sfb=False, measured_error=measured_error)  # no SFB: the emitter builds none
        strategy = planned.strategy
        strategy.name = "tag"
        return strategy
    return load_strategy(name, sim)


def mixed_strategy(sim, profiles):
    """METIS groups taking the four options in turn, on every machine, the first or the last."""
    import numpy as np

    from tag_core.plan.planner import make_groups
    from tag_core.simulate.strategy import OPTIONS, Strategy

    groups = make_groups(sim.graph, profiles, MIXED_GROUPS)
    machines = sim.topology.num_machines
    masks = [np.ones(machines, dtype=bool), np.eye(machines, dtype=bool)[0], np.eye(machines, dtype=bool)[-1]]
    options = [OPTIONS[g % len(OPTIONS)] for g in range(groups.num_groups)]
    chosen = [masks[(g // len(OPTIONS) + g) % len(masks)] for g in range(groups.num_groups)]
    return Strategy(groups.assignment, np.array(chosen, dtype=bool), options, np.ones(sim.num_devices), name="mixed")


def _prepare(spec, topology, profiles, comm, uncalibrated, error, name: str, budget_iterations: int, label: str,
             folder: Path) -> tuple[dict, Path | None, Emission | None]:
    """Build, predict and emit one strategy: its row, its folder and its emission (None, None when it could not
    be emitted)."""
    from tag_core.emit.emitter import emit
    from tag_core.emit.folder import write_emission
    from tag_core.emit.prediction import predict_emission
    from tag_core.errors import TagInputError
    from tag_core.simulate.simulator import Simulator

    row = {"strategy": name, "predicted_s": None, "measured_s": None, "spread_s": None}

    def build(graph, topo):
        _say(f"{label}: {'searching a plan' if name == 'tag' else 'building the strategy'}")
        sim = Simulator(graph, topo, profiles, batch_size=spec.batch_size, comm=comm)
        return build_strategy(name, sim, profiles, budget_iterations, error)

    try:
        _say(f"{label}: emitting")
        emission = emit(spec, topology, build, "cpu", profiles=profiles)
        predicted = predict_emission(emission, profiles, comm, uncalibrated)
        write_emission(emission, folder, prediction=predicted)
    except (TagInputError, RuntimeError) as exc:  # a strategy the emitter cannot build: this row fails alone
        row["error"] = f"emit failed: {exc}"
        _say(f"{label}: {row['error']}")
        return row, None, None
    row.update(_prediction_fields(predicted))
    row["emitted"] = graph_facts(emission.emitted.graph_def, [emission.emitted.loss_tensor, emission.emitted.train_op])
    _say(f"{label}: predicted {row['predicted_s'] * 1e3:.2f} ms")
    return row, folder, emission


def _prediction_fields(predicted: dict) -> dict:
    return {"predicted_s": predicted["iteration_time_s"],
            "terms": {"busy_s": max(predicted["busy_s"]), **{k: v for k, v in predicted["comm_s"].items() if v}}}


def graph_facts(graph_def, fetches: list[str]) -> dict:
    """What one training step (the ops `fetches` need, not the initialisation) makes the runtime do: ops per
    task, tensors and control edges that cross tasks (each a send/recv pair at most), collective ops."""
    nodes = {node.name: node for node in graph_def.node}

    def task(name: str) -> str:
        device = nodes[name].device
        return device.split("/task:")[1].split("/")[0] if "/task:" in device else "?"

    step, todo = set(), [f.split(":")[0] for f in fetches]
    while todo:
        name = todo.pop()
        if name in nodes and name not in step:
            step.add(name)
            todo += [i.lstrip("^").split(":")[0] for i in nodes[name].input]
    ops: dict[str, int] = {}
    data, control = set(), set()
    for name in step:
        ops[task(name)] = ops.get(task(name), 0) + 1
        for source in nodes[name].input:
            if source.lstrip("^").split(":")[0] in step and task(source.lstrip("^").split(":")[0]) != task(name):
                # Counted once per (source, receiving task): the most send/recv pairs TF may fold them into.
                (control if source.startswith("^") else data).add((source.lstrip("^"), task(name)))
    return {"ops_per_task": dict(sorted(ops.items())), "cross_task_tensors": len(data),
            "cross_task_control_edges": len(control),
            "collectives": sum(nodes[name].op.startswith("Collective") for name in step)}


def _measure(args, rows: list[dict], folders: dict[str, Path], between_rounds=None) -> dict[str, dict]:
    """Time every emitted strategy interleaved (calling `between_rounds` between rounds); fill in the rows.
    Returns the `measured_steps` row of each strategy timed (stored once the predictions are final: `_store`)."""
    from tag_core.runtime.interleave import measure_interleaved
    from tag_core.runtime.measure import measured_step_row
    from tag_core.runtime.supervisor import check_folder

    names = list(folders)
    _say(f"measuring {len(names)} strategies interleaved: {args.warmup} warm-up steps each, then {args.steps} timed "
         f"steps each over {args.rounds} rounds")
    outcomes = measure_interleaved([folders[n] for n in names], args.steps, args.warmup, args.rounds,
                                   timeout=args.timeout, echo=lambda line: _say(f"  {line}"),
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
        _say(f"{name}: measured {timing.median_s * 1e3:.2f} ms (interquartile range {timing.spread_s * 1e3:.2f} ms), "
             f"predicted {row['predicted_s'] * 1e3:.2f} ms")
    return stored


def _store(args, rows: list[dict], stored: dict[str, dict], calibration_hash: str | None) -> None:
    """Each timed strategy's `measured_steps` row, with the prediction the report gives (from the profiles
    and the calibration after the rounds with --profile-after and --calibrate-after)."""
    from tag_core.runtime.measure import save_measured_step

    for row in rows:
        if row["strategy"] in stored:
            save_measured_step({**stored[row["strategy"]], "predicted_s": row["predicted_s"],
                                "calibration_hash": calibration_hash}, args.db)


def summarise(rows: list[dict], model: str, topology: str, batch: int, calibration: str | None, steps: int,
              warmup: int) -> dict:
    """The report: rows with their errors, Spearman's rank correlation, median |error|, TAG against the best."""
    from tag_core.plan.measured_error import median_abs_error, relative_error
    from tag_core.runtime.measure import SPREAD, spearman, tag_against_best

    done = [r for r in rows if r["measured_s"] is not None and r["predicted_s"] is not None]
    for r in done:
        r["relative_error"] = relative_error(r["predicted_s"], r["measured_s"])
    return {"model": model, "topology": topology, "batch_size": batch, "calibration": calibration,
            "steps": steps, "warmup": warmup, "spread": SPREAD, "rows": rows,
            "spearman": spearman([r["predicted_s"] for r in done], [r["measured_s"] for r in done]),
            "median_abs_error": median_abs_error([(r["predicted_s"], r["measured_s"]) for r in done]),
            "tag_against_best": tag_against_best(done)}


def format_report(report: dict) -> str:
    calibration = report["calibration"] or "none (the cost model's defaults)"
    lines = [f"{report['model']} on {report['topology']}, batch {report['batch_size']}: median of {report['steps']} "
             f"timed steps after {report['warmup']} warm-up, interleaved over {report['rounds']} rounds; spread = {report['spread']}; calibration {calibration}",
             f"{'strategy':<16} {'predicted ms':>13} {'measured ms':>12} {'spread ms':>10} {'error':>8}"]
    for r in report["rows"]:
        if r["measured_s"] is None:
            predicted = "-" if r["predicted_s"] is None else f"{r['predicted_s'] * 1e3:.2f}"
            lines.append(f"{r['strategy']:<16} {predicted:>13} {'FAILED':>12}  {r.get('error', '').splitlines()[0]}")
            continue
        partly = f"  ({r['steps']} of {report['steps']} steps)" if r.get("stopped") else ""
        lines.append(f"{r['strategy']:<16} {r['predicted_s'] * 1e3:13.2f} {r['measured_s'] * 1e3:12.2f} "
                     f"{r['spread_s'] * 1e3:10.2f} {r['relative_error']:+8.1%}{partly}")
    rho, error = report["spearman"], report["median_abs_error"]
    lines.append(f"Spearman rank correlation, predicted against measured: "
                 f"{'undefined' if rho is None else f'{rho:.2f}'}")
    lines.append(f"median |error|: {'-' if error is None else f'{error:.1%}'}")
    verdict = report["tag_against_best"]
    if verdict:
        lines.append(verdict["text"])
    return "\n".join(lines)
