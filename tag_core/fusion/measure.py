"""Measure a training step under four execution modes, each in its own process.

Modes: `tf` (no XLA), `autocluster` (TF's auto-clustering, which reads
TF_XLA_FLAGS once at start-up: hence one process per mode), `jit` (the whole
step under `tf.function(jit_compile=True)`), and `tag` (the step graph with
TAG's fusion patterns marked as XLA clusters). Session modes also report
kernels per step: the nodes TF's step stats list for one traced run. Every mode
also reports its first step (compilation included) and the process's peak RSS.

`measure_paired` runs the modes in one process instead (optionally also `function`: the `jit` mode's
harness, a `tf.function` step, without XLA), a step of each in
turn (auto-clustering as a session with global_jit_level ON_2 under
`--tf_xla_cpu_global_jit`, which is what the flags above set for every
session): the median over rounds of each mode's step time over the no-XLA
step's in the same round is a ratio that load from other work on the machine
barely moves.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from tag_core import tf_children

MODES = ("tf", "autocluster", "jit", "tag")
AUTOCLUSTER_FLAGS = "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit"


def measure_modes(model: str, batch_size: int, step_file: str, plan_file: str | None, steps: int = 10,
                  warmup: int = 3, modes=MODES, timeout_s: float = 1800) -> dict[str, dict]:
    """{mode: {"step_ms": median, "kernels": count or None, "first_step_ms", "peak_rss_mb"}} for each mode."""
    results = {}
    for mode in modes:
        env = dict(os.environ)
        env.pop("TF_XLA_FLAGS", None)
        if mode == "autocluster":
            env["TF_XLA_FLAGS"] = AUTOCLUSTER_FLAGS
        command = [sys.executable, "-m", "tag_core.fusion.measure", mode, model, str(batch_size), step_file,
                   plan_file or "", str(steps), str(warmup)]
        done = tf_children.run(command, env=env, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"measuring {model} in mode {mode} failed:\n{done.stderr[-2000:]}")
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


PAIRED_FLAGS = "--tf_xla_cpu_global_jit"
# Auto-clustering limited to what XLA calls fusible ops (elementwise, reductions, layout...; no MatMul or
# Conv): XLA confined to the op classes TAG's planner may fuse, to tell apart where an XLA mode's gain comes from.
FUSIBLE_ONLY_FLAGS = PAIRED_FLAGS + " --tf_xla_ops_to_cluster=FUSIBLE"
# A pause before each timed step: thread pools spin for a while after a step, and would slow whichever ran next.
GAP_S = 0.02


def measure_paired(model: str, batch_size: int, step_file: str, plan_file: str, rounds: int = 10, warmup: int = 2,
                   timeout_s: float = 3600, modes=MODES, flags: str = PAIRED_FLAGS) -> dict:
    """{"ratio_to_tf": {mode: median paired ratio}, "step_ms": {mode: median}, "rounds": n}, from one process.

    `modes` must include `tf`; `flags` is the process's TF_XLA_FLAGS (read once, so it holds for every mode)."""
    if "tf" not in modes:
        raise ValueError("paired modes must include tf: ratios are to its step")
    env = dict(os.environ, TF_XLA_FLAGS=flags)
    command = [sys.executable, "-m", "tag_core.fusion.measure", "paired:" + ",".join(modes), model, str(batch_size),
               step_file, plan_file, str(rounds), str(warmup)]
    done = tf_children.run(command, env=env, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"measuring {model} paired failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _session_runner(mode: str, spec, step, plan_file: str, auto_jit: bool = False):
    """(run one step, run one traced step returning RunMetadata) for a session mode."""
    import tensorflow as tf

    from tag_core.capture.trace import synthetic_batch
    from tag_core.profile.profiler import initialise_randomly

    from .patterns import FusionPlan
    from .regions import session_config
    from .step_check import step_fetches
    from .xla_marks import mark_for_xla

    graph_def = tf.compat.v1.GraphDef()
    graph_def.CopyFrom(step.graph_def)
    plan = None
    if mode == "tag":
        with open(plan_file) as handle:
            plan = FusionPlan.from_json(json.load(handle))
        mark_for_xla(graph_def, plan, step_fetches(step))
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    config = session_config(plan)
    if auto_jit:
        config.graph_options.optimizer_options.global_jit_level = tf.compat.v1.OptimizerOptions.ON_2
    session = tf.compat.v1.Session(graph=graph, config=config)
    initialise_randomly(session, step)
    feed = dict(zip(step.input_tensors, synthetic_batch(spec, step.batch_size)))
    fetches = [step.loss_tensor, step.train_ops]

    def traced():
        metadata = tf.compat.v1.RunMetadata()
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        session.run(fetches, feed_dict=feed, options=options, run_metadata=metadata)
        return metadata

    return (lambda: session.run(fetches, feed_dict=feed)), traced


def _session_step(mode: str, spec, step_file: str, plan_file: str, steps: int, warmup: int) -> dict:
    from tag_core.capture.steps import load_step

    run, traced = _session_runner(mode, spec, load_step(step_file), plan_file)
    first, times = _timed_runs(run, steps, warmup)
    return _result(first, times, count_kernels(traced()))


def _paired(spec, step_file: str, plan_file: str, rounds: int, warmup: int, modes=MODES) -> dict:
    import numpy as np

    from tag_core.capture.steps import load_step

    step = load_step(step_file)
    runners, kernels = {}, {}
    for mode in modes:
        if mode in ("jit", "function"):
            runners[mode] = _jit_runner(spec, step.batch_size, jit_compile=mode == "jit")
            continue
        run, traced = _session_runner(mode, spec, step, plan_file, auto_jit=mode == "autocluster")
        runners[mode] = run
        for _ in range(warmup):
            run()
        kernels[mode] = count_kernels(traced())
    for run in runners.values():
        for _ in range(warmup):
            run()
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    rng = np.random.default_rng(0)
    for _ in range(rounds):
        for mode in rng.permutation(modes):  # no mode always runs after the same one
            time.sleep(GAP_S)
            start = time.perf_counter()
            runners[mode]()
            times[mode].append(time.perf_counter() - start)
    base = np.array(times["tf"])
    return {"rounds": rounds, "step_ms": {m: round(float(np.median(t)) * 1e3, 3) for m, t in times.items()},
            "ratio_to_tf": {m: round(float(np.median(np.array(t) / base)), 4) for m, t in times.items()},
            "kernels": kernels, "peak_rss_mb": peak_rss_mb()}


# Executor bookkeeping, not kernels: XLA's compile/merge/switch around a cluster, feeds, handles.
BOOKKEEPING = {"_SOURCE", "Const", "NoOp", "VarHandleOp", "_Arg", "_Retval", "Identity", "_XlaCompile",
               "_XlaMerge", "Switch", "Placeholder"}


def count_kernels(metadata) -> int:
    """Kernels one step ran: step-stats nodes less bookkeeping; an XLA cluster's `_XlaRun` counts once."""
    count = 0
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            label = node.timeline_label.split("] ")[-1]
            op_type = label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else node.node_name
            count += op_type not in BOOKKEEPING
    return count


def _jit_step(spec, batch_size: int, steps: int, warmup: int) -> dict:
    first, times = _timed_runs(_jit_runner(spec, batch_size), steps, warmup)
    return _result(first, times, None)


def _jit_runner(spec, batch_size: int, jit_compile: bool = True):
    """A step of the Keras model under `tf.function`: `jit` mode, or with `jit_compile=False` the `function`
    mode, the same harness without XLA (it tells how much of jit's lead over the session modes is the harness)."""
    import tensorflow as tf

    from tag_core.capture.trace import build_keras, synthetic_batch

    model, optimizer = build_keras(spec)
    loss_fn = spec.make_loss()
    *inputs, labels = [tf.constant(a) for a in synthetic_batch(spec, batch_size)]

    @tf.function(jit_compile=jit_compile)
    def step(inputs, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(labels, model(inputs if len(inputs) > 1 else inputs[0], training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients([(g, v) for g, v in zip(grads, model.trainable_variables) if g is not None])
        return loss

    return lambda: step(inputs, labels).numpy()


def _result(first: float, times: list[float], kernels: int | None) -> dict:
    return {"step_ms": statistics.median(times) * 1e3, "kernels": kernels, "first_step_ms": first * 1e3,
            "step_ms_each": [round(t * 1e3, 3) for t in times], "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float | None:
    """This process's peak resident set (VmHWM; ru_maxrss would include the parent's from before exec)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _timed_runs(run, steps: int, warmup: int) -> tuple[float, list[float]]:
    """Seconds of the first run (compilation included), and of each timed run after the warm-up."""
    start = time.perf_counter()
    run()
    first = time.perf_counter() - start
    for _ in range(warmup - 1):
        run()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return first, times


def _main(argv: list[str]) -> int:
    mode, model, batch, step_file, plan_file, steps, warmup = argv
    from tag_core.capture.models import resolve_model

    spec = resolve_model(model, int(batch))
    if mode == "jit":
        result = _jit_step(spec, int(batch), int(steps), int(warmup))
    elif mode.startswith("paired"):
        modes = mode.partition(":")[2].split(",") if ":" in mode else MODES
        result = _paired(spec, step_file, plan_file, int(steps), int(warmup), tuple(modes))
    else:
        result = _session_step(mode, spec, step_file, plan_file, int(steps), int(warmup))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

