"""Per-op compute times of a training step, from TF's own traces.

Each batch size's step runs in a v1 Session; after warm-up runs, each
recorded run uses `RunOptions(trace_level=FULL_TRACE)` and the per-node times
in `run_metadata.step_stats` become `op_profiles` rows. Ops run one at a
time (inter-op parallelism 1) so that a time is the op's own, not shared,
and Grappler is off so node names stay those of the OpGraph. An op that TF
fuses into its consumer anyway (oneDNN's Conv2D+BiasAdd) is recorded at 0 µs
and its consumer carries the fused kernel's time.
"""

from __future__ import annotations

import datetime
import socket
from collections import defaultdict

import numpy as np
import pandas as pd

from tag_core import store
from tag_core.capture.models.spec import ModelSpec
from tag_core.capture.steps import ensure_captured, ensure_step_files, load_step
from tag_core.capture.trace import INIT_SCOPE, TracedStep, synthetic_batch
from tag_core.errors import TagInputError


def detect_device_type() -> str:
    """The catalog name of the first GPU TF sees, or `cpu`."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "cpu"
    from tag_core.cluster.gpu_catalog import normalise_device_name

    details = tf.config.experimental.get_device_details(gpus[0])
    return normalise_device_name(details.get("device_name", "gpu"))


def initialise_randomly(session, step: TracedStep, seed: int = 0) -> None:
    """Small random parameters, zero optimizer slots, recorded values for small variables
    (learning rate, step counter); one variable at a time to keep memory flat."""
    rng = np.random.default_rng(seed)
    for i, variable in enumerate(step.variables):
        dtype = np.dtype(variable.dtype)
        if variable.initial is not None:
            value = np.asarray(variable.initial, dtype=dtype).reshape(variable.shape)
        elif variable.owner == "model" and dtype.kind == "f":
            value = (rng.standard_normal(variable.shape, dtype=np.float32) * 0.05).astype(dtype)
        else:
            value = np.zeros(variable.shape, dtype=dtype)
        session.run(f"{INIT_SCOPE}/assign_{i}", feed_dict={f"{INIT_SCOPE}/value_{i}:0": value})


def _session(step: TracedStep):
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(step.graph_def, name="")
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1)
    # Grappler would fuse and rename nodes; per-op times must match the OpGraph's ops.
    config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return tf.compat.v1.Session(graph=graph, config=config)


def _node_times(run_metadata) -> dict[str, float]:
    """Microseconds per node; GPU kernel times (stream:all) win over host-side times."""
    host, streams = defaultdict(float), defaultdict(float)
    for device in run_metadata.step_stats.dev_stats:
        target = streams if "stream:all" in device.device else host
        if "stream:" in device.device and "stream:all" not in device.device:
            continue
        for node in device.node_stats:
            name = node.node_name.split(":")[0]
            target[name] += max(node.op_end_rel_micros - node.op_start_rel_micros, 0)
    return {**host, **streams}


def profile_step(step: TracedStep, spec: ModelSpec, op_names: list[str], runs: int, warmup: int, progress=None):
    """Yield (run, op, time_us) for `runs` traced runs after `warmup` untraced ones."""
    import tensorflow as tf

    session = _session(step)
    try:
        initialise_randomly(session, step)
        feed = dict(zip(step.input_tensors, synthetic_batch(spec, step.batch_size)))
        fetches = [step.loss_tensor, step.train_ops]
        for _ in range(warmup):
            session.run(fetches, feed_dict=feed)
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        for run in range(runs):
            metadata = tf.compat.v1.RunMetadata()
            session.run(fetches, feed_dict=feed, options=options, run_metadata=metadata)
            times = _node_times(metadata)
            for name in op_names:
                # Absent: fed (inputs) or fused into a consumer by TF's graph rewrites
                # (oneDNN Conv2D+BiasAdd); the consumer's time then covers both.
                yield run, name, float(times.get(name, 0.0))
            if progress is not None:
                progress.update(1)
    finally:
        session.close()


def profile_model(
    conn,
    spec: ModelSpec,
    batch_sizes: list[int],
    runs: int = 5,
    warmup: int = 2,
    show_progress: bool = True,
) -> pd.DataFrame:
    """Profile every op of `spec` at each batch size; store and return the rows."""
    import tensorflow as tf
    from tqdm import tqdm

    if not batch_sizes or any(not isinstance(b, int) or b <= 0 for b in batch_sizes):
        raise TagInputError("batch_sizes", f"must be positive integers, got {batch_sizes!r}")
    if not isinstance(runs, int) or runs <= 0:
        raise TagInputError("runs", f"must be a positive integer, got {runs!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise TagInputError("warmup", f"must be a non-negative integer, got {warmup!r}")
    graph = ensure_captured(conn, spec)
    op_names = [op.name for op in graph.ops]
    device_type = detect_device_type()
    host, version = socket.gethostname(), tf.__version__
    step_files = ensure_step_files(spec, batch_sizes, sum(v.bytes for v in graph.variables))
    rows = []
    with tqdm(total=len(batch_sizes) * runs, desc=f"profile {spec.name}", unit="run", disable=not show_progress) as bar:
        for batch in batch_sizes:
            bar.set_postfix(batch=batch)
            for run, op, micros in profile_step(load_step(step_files[batch]), spec, op_names, runs, warmup, bar):
                rows.append((spec.name, op, device_type, batch, run, micros))
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    frame = pd.DataFrame(rows, columns=["model", "op", "device_type", "batch_size", "run", "time_us"])
    frame["host"], frame["tf_version"], frame["profiled_at"] = host, version, now
    store.replace_profiles(conn, frame)
    return frame
