"""The step check: a tuned plan kept only if the whole step gets faster.

A pattern that wins alone can still lose inside the step (its plain ops ran
beside other work; the cluster adds executor ops), so `check_step` then times
the whole step with the kept patterns against the plain step, alternating in
one process (a step of each in turn, in shuffled order, for at least
`STEP_CHECK_S` of steps), and also with only the half and the quarter of
them that saved most, and with the compiled regions tuning proposed
(`regions.py`; less the patterns that lie in them, which XLA fuses within
the region). Each variant has the process to itself beside the plain
step, its session closed before the next one opens: with the pattern
variants' sessions open beside it, a region's step on the transformer measured
0.90-0.98 of the plain step, against 0.82-0.84 alone. The regions go first.
A variant beats the plain step when the median of its paired ratios (variant
over plain, round by round) is `STEP_MARGIN` below 1 and the confidence interval
of that median stays below 1 (paired.py). Of those, the first in that order whose
median is within the fastest one's interval is kept, so that variants the noise
cannot tell apart do not take turns from run to run; with none, the plan is
emptied, which is the plain step. A tuned plan is therefore never slower than no XLA beyond the noise of
that comparison.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from tag_core.capture.graph import copy_graph_def

from .paired import median_interval
from .patterns import FusionPlan

STEP_MARGIN = 0.02  # the whole step with the plan must be this much faster than without (noise here: ~2%)
STEP_CHECK_S = 3.0  # seconds of steps per variant when checking...
STEP_CHECK_ROUNDS = 400  # ...in 6 to this many rounds (small steps need many: their noise is larger)
STEP_GAP_S = 0.02  # pause before each timed step: thread pools spin after a step and would slow the next one


def check_step(plan: FusionPlan, step, spec, margin: float = STEP_MARGIN, seconds: float = STEP_CHECK_S,
               progress: bool = False) -> FusionPlan:
    """Keep the variant of a tuned plan that makes the whole step fastest, if it beats the plain step by
    `margin`; else no patterns and no regions. Variants: all the tuned patterns, the half or the quarter that
    saved most, each as clusters of their own; and, when tuning proposed them, the regions."""
    import tensorflow as tf

    from tag_core.capture.trace import synthetic_batch
    from tag_core.profile.profiler import initialise_randomly

    from .regions import outside_regions, session_config
    from .xla_marks import mark_for_xla

    if not plan.patterns and not plan.regions:
        return plan
    saving = plan.measured.get("pattern_saving_us") or [0.0] * len(plan.patterns)
    ranked = sorted(range(len(plan.patterns)), key=lambda k: -saving[k])
    sizes = sorted({len(ranked), len(ranked) // 2, len(ranked) // 4} - {0}, reverse=True)
    variants = [replace(plan, patterns=[plan.patterns[k] for k in sorted(ranked[:n])], regions=[],
                        measured=dict(plan.measured, pattern_saving_us=[saving[k] for k in sorted(ranked[:n])]))
                for n in sizes]
    if plan.regions:  # timed first
        variants.insert(0, outside_regions(plan))
    feed = dict(zip(step.input_tensors, synthetic_batch(spec, step.batch_size)))
    fetches = [step.loss_tensor, step.train_ops]

    def session_for(variant):
        graph_def = copy_graph_def(step.graph_def)
        if variant is not None:
            mark_for_xla(graph_def, variant, step_fetches(step))
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
        session = tf.compat.v1.Session(graph=graph, config=session_config(variant))
        initialise_randomly(session, step)
        return session

    plain_session = session_for(None)
    intervals, rounds, plain_times = [], [], []
    try:
        for _ in range(2):
            start = time.perf_counter()
            plain_session.run(fetches, feed_dict=feed)
        warm = time.perf_counter() - start  # the plain step's time should no variant compile
        for variant in variants:  # each alone beside the plain step: variants' sessions never share the process
            found = _paired_with_plain(plain_session, session_for(variant), fetches, feed, seconds)
            intervals.append(median_interval(found[0]) if found else (np.inf, np.inf, np.inf))
            rounds.append(len(found[0]) if found else 0)
            plain_times.extend(found[1] if found else [])
    finally:
        plain_session.close()
    chosen = _choose(variants, intervals, margin) or replace(plan, patterns=[], regions=[])
    measured = dict(chosen.measured, step_check={
        "plain_ms": round(float(np.median(plain_times or [warm])) * 1e3, 3),
        "rounds": min((n for n in rounds if n), default=0),
        "variants": [{"patterns": len(v.patterns), "regions": len(v.regions), "rounds": n,
                      **({"ratio": round(median, 4), "ratio_interval": [round(low, 4), round(high, 4)]}
                         if np.isfinite(median) else {"failed": True})}
                     for v, (low, median, high), n in zip(variants, intervals, rounds)],
        "kept_patterns": len(chosen.patterns), "kept_regions": len(chosen.regions)})
    if not chosen.patterns:
        measured["pattern_saving_us"] = []
    fused_ops = sum(len(p) for p in chosen.patterns)
    return replace(chosen, kernels_after=plan.kernels_before - fused_ops + len(chosen.patterns), measured=measured)


def _choose(variants: list[FusionPlan], intervals: list[tuple[float, float, float]], margin: float):
    """The first variant that beats the plain step (see the module docstring) with a median within the fastest
    one's interval; None when none beats it."""
    beats = [k for k, (_, median, high) in enumerate(intervals) if median <= 1.0 - margin and high < 1.0]
    if not beats:
        return None
    fastest = min(beats, key=lambda k: intervals[k][1])
    return variants[next(k for k in beats if intervals[k][1] <= intervals[fastest][2])]


def _paired_with_plain(plain_session, session, fetches, feed, seconds: float):
    """(the variant's step over the plain step's, round by round; the plain step's times), a step of each in
    turn, for at least 6 rounds and `seconds` of variant steps; None if XLA could not compile the variant.
    Closes the variant's session."""
    import tensorflow as tf

    try:
        try:
            for _ in range(2):  # compile, warm up
                start = time.perf_counter()
                session.run(fetches, feed_dict=feed)
        except tf.errors.OpError:
            return None
        gap = min(STEP_GAP_S, time.perf_counter() - start)
        times = {plain_session: [], session: []}
        rng = np.random.default_rng(0)
        while len(times[session]) < 6 or (len(times[session]) < STEP_CHECK_ROUNDS and sum(times[session]) < seconds):
            for k in rng.permutation(2):  # neither always runs after the other
                which = (plain_session, session)[k]
                time.sleep(gap)
                start = time.perf_counter()
                which.run(fetches, feed_dict=feed)
                times[which].append(time.perf_counter() - start)
    finally:
        session.close()
    plain = np.array(times[plain_session])
    return list(np.array(times[session]) / plain), list(plain)


def step_fetches(step) -> list[str]:
    """What a session runs for one step of `step`: the loss and the train ops."""
    return [step.loss_tensor, *step.train_ops]
