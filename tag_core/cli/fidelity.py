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
row keeps its prediction from the profile and calibration before as predicted_before_s. Without
--profile-after the model is still profiled once after the last round: where its step moved by more than
15% from the profile before, the report says that the machine drifted and predicts from the profile after
(--no-drift-check skips this).
"""

from __future__ import annotations

import sys

from ._common import (
    add_model_timeout,
    non_negative_int,
    positive_float,
    positive_int,
    positive_int32,
    print_json,
    require,
)

DEFAULT_STRATEGIES = ("single", "dp-nccl", "dp-nccl-p", "horovod", "ps", "model_parallel", "duplicate", "mixed", "tag")
EXTRA = ("mixed", "tag")  # not names `tag simulate` knows: tag_core.plan.compared_strategies builds them


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
    parser.add_argument("--no-drift-check", dest="drift_check", action="store_false",
                        help="do not profile the model again after the measurement to see whether the machine "
                             "drifted since the profile before (by default it does, and where a step's time moved "
                             "by more than 15%% the report says so and predicts from the profile after)")
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
    from tag_core.cluster.topology_json import load_topology
    from tag_core.errors import TagInputError
    from tag_core.runtime.fidelity import FidelitySettings, measure_fidelity
    from tag_core.runtime.fidelity_report import all_measured, format_report

    try:
        topology = load_topology(args.topology)
    except TagInputError as exc:  # named by the file: name the argument too
        raise TagInputError("--topology", f"{exc.where}: {exc.problem}") from None
    kinds = sorted({m.gpu.name for m in topology.machines})
    require(kinds == ["cpu"], "--topology", f"{topology.name} has {', '.join(kinds)} machines; fidelity runs "
                                            "here, on CPU tasks: use the topology `tag calibrate --local N` writes")
    settings = FidelitySettings(tuple(args.strategies), args.steps, args.warmup, args.rounds, args.budget_iterations,
                                args.timeout, args.profile_after, args.calibrate_after, args.drift_check)
    report = measure_fidelity(args.model, args.batch_size, args.model_timeout, topology, settings, args.db, _say)
    if args.json:
        print_json(report)
    else:
        print(format_report(report))
    return 0 if all_measured(report) else 1
