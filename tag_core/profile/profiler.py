"""Per-op compute times of a training step, from TF's own traces, taken the way the runtime runs the step.

Each batch size's step runs in a child process (tag_core.profile.timing) set up as a device of the
runtime: pinned to one core with one intra-op and two inter-op threads (`threads` 1, as
tag_core.runtime.local_cluster serves each device and as `tag run` runs a one-device graph here; 0 for
TF's defaults, unpinned), Grappler on, one train target. After warm-up runs, each recorded run gives
`op_profiles` rows:

- `time_us`: the op's traced time (its kernel, and the nodes scoped under it: a variable handle, a
  lowered loop's body). An op TF did not run (fed, folded by Grappler, fused into a neighbour) is 0 µs;
  the neighbour carries the fused kernel's time.
- `overhead_us`: what running the op costs the executor beyond that, which node stats leave out. The
  untraced step less its launch (session.run of a trivial op) less the traced node times is the executor's
  work around the kernels (dispatch, handing tensors on and freeing them, the constants and variable handles
  the OpGraph leaves out), net of the tracer's own time inside them; it is spread over the OpGraph ops per
  node each ran. 0 for ops TF did not run; negative where tracing added more than the executor spent.

Memory: the timing child's TF allocator may reserve at most ALLOCATOR_LIMIT_BYTES for the step's tensors;
without a limit it keeps pages it no longer uses (tag_core.profile.timing), vgg19 at batch 4 4.9 GB in all.

The step as a whole (untraced wall-clock time, traced sums, nodes run, dispatch and launch costs) goes to
`profile_steps`, so a profile can be checked against the step it came from (benchmarks/fidelity_one_device.py).
Measured here with one pinned thread: 0.7-1.6 µs a node beyond the traced kernels (mobilenet_v2 at 32
pixels, batch 4: 7,805 nodes, about 10% of a 54 ms step), while a chain of trivial scalar ops dispatches at
0.15-0.3 µs a node: the cost belongs to the real nodes, so it is measured on the step itself.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import warnings
from collections import deque
from pathlib import Path

import numpy as np
import pandas as pd

from tag_core import store, tf_children
from tag_core.capture.models.spec import ModelSpec
from tag_core.capture.steps import CHILD_TRACE_BYTES, ensure_captured, ensure_step_files
from tag_core.capture.trace import INIT_SCOPE, TracedStep
from tag_core.errors import TagInputError

RUNTIME_THREADS = 1  # a device of the local runtime: one core, one compute thread (timing.pool_sizes)
# What the profiling child's CPU allocator may reserve for the step's tensors (tag_core.profile.timing): issue
# 21's 4 GiB for capture and profile, less the `tag` process (~0.2 GB) and what the child holds besides
# tensors (TF's libraries and Python 0.5 GB, malloc's arenas and the traced run's stats 0.2-0.35 GB).
# vgg19's step needs 2.8-3.1 GB of tensors; a step that needs more runs again without the limit.
ALLOCATOR_LIMIT_BYTES = 3200 * 2**20
OUT_OF_MEMORY = 3  # the timing child's exit status when its step needs more than the job's allocator_limit


class AllocatorLimitExceeded(RuntimeError):
    """The profiling child's step needed more than its allocator limit."""


def detect_device_type() -> str:
    """The catalog name of the first GPU TF sees, or `cpu`."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "cpu"
    from tag_core.cluster.gpu_catalog import normalise_device_name

    details = tf.config.experimental.get_device_details(gpus[0])
    return normalise_device_name(details.get("device_name", "gpu"))


INIT_CHUNK_BYTES = 64 << 20  # values fed to one session.run of initialisation


def initialise_randomly(session, step: TracedStep, seed: int = 0, chunk_bytes: int = INIT_CHUNK_BYTES) -> None:
    """Small random parameters, zero optimizer slots, recorded values for small variables
    (learning rate, step counter). The assignments go in runs of up to `chunk_bytes` of values (or one
    larger variable), which keeps memory flat; one run a variable made DenseNet121's 1,800 variables take 4
    minutes, as every new set of fetches costs the session a pass over the whole 18,000-node graph."""
    rng = np.random.default_rng(seed)
    targets, feed, held = [], {}, 0
    for i, variable in enumerate(step.variables):
        dtype = np.dtype(variable.dtype)
        if variable.initial is not None:
            value = np.asarray(variable.initial, dtype=dtype).reshape(variable.shape)
        elif variable.owner == "model" and dtype.kind == "f":
            # In place: vgg19's largest kernel is 411 MB, and each temporary copy of it is as large.
            value = rng.standard_normal(variable.shape, dtype=np.float32)
            value *= 0.05
            value = value.astype(dtype, copy=False)
        else:
            value = np.zeros(variable.shape, dtype=dtype)
        if targets and held + value.nbytes > chunk_bytes:
            session.run(targets, feed_dict=feed)
            targets, feed, held = [], {}, 0
        targets.append(f"{INIT_SCOPE}/assign_{i}")
        feed[f"{INIT_SCOPE}/value_{i}:0"] = value
        held += value.nbytes
    if targets:
        session.run(targets, feed_dict=feed)


def _session(step: TracedStep):
    """A session on the step with Grappler off and ops one at a time (node names stay the OpGraph's). The
    profiler itself times steps in tag_core.profile.timing; this is for callers that want a plain session."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(step.graph_def, name="")
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1)
    config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return tf.compat.v1.Session(graph=graph, config=config)


def op_overheads(execs: np.ndarray, dispatch_us: float | None, other_kernel_us: float, other_nodes: int) -> np.ndarray:
    """Each op's executor cost beyond its traced time, in µs: `dispatch_us` (the untraced step's time beyond
    launch and traced node times, per node the executor ran) per node the op ran (`execs`), plus its share,
    per node it ran, of the nodes outside the OpGraph (their traced time and their dispatch). The shares add
    up to the whole: step - launch - traced OpGraph time. NaN everywhere when not measured (on a GPU)."""
    execs = np.asarray(execs, dtype=np.float64)
    if dispatch_us is None:
        return np.full(len(execs), np.nan)
    total = execs.sum()
    shared = (other_kernel_us + other_nodes * dispatch_us) / total if total > 0 else 0.0
    return execs * (dispatch_us + shared)


def runtime_cores(threads: int | None) -> list[int] | None:
    """The cores a profile pins to: the first `threads` this process may use (task 0 of a local cluster
    is pinned to the first), or None (unpinned) for TF's default pools."""
    if not threads:
        return None
    cores = sorted(os.sched_getaffinity(0))
    return cores[:threads]


def _run_child(job: dict, progress=None) -> tuple[list[dict], dict]:
    """Run tag_core.profile.timing on `job`: (its records, its start event: device type, TF version), or
    RuntimeError with the end of its stderr."""
    with tempfile.TemporaryDirectory(prefix="tag-profile-") as work:
        job = {**job, "out": str(Path(work) / "runs.jsonl")}
        job_file = Path(work) / "job.json"
        job_file.write_text(json.dumps(job))
        root = str(Path(__file__).resolve().parents[2])  # the folder that holds tag_core
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        child = tf_children.popen([sys.executable, "-m", "tag_core.profile.timing", str(job_file)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        tail: deque = deque(maxlen=40)
        import threading

        reader = threading.Thread(target=lambda: [tail.append(line.rstrip()) for line in child.stderr], daemon=True)
        reader.start()
        started = {}
        for line in child.stdout:
            if line.startswith('{"event": "run"') and progress is not None:
                progress.update(1)
            elif line.startswith('{"event": "start"'):
                started = json.loads(line)
        code = child.wait()
        reader.join(timeout=5)
        # Below a few MiB TF's allocator crashes instead of raising: under a limit, a signal counts as too little.
        if job.get("allocator_limit") and (code == OUT_OF_MEMORY or code < 0):
            raise AllocatorLimitExceeded(f"the step needs more than {job['allocator_limit']} bytes of tensors "
                                         f"(exit {code})")
        if code != 0:
            raise RuntimeError(f"profiling failed (exit {code}):\n" + "\n".join(tail))
        return [json.loads(line) for line in Path(job["out"]).read_text().splitlines() if line], started


def profile_model(
    conn,
    spec: ModelSpec,
    batch_sizes: list[int],
    runs: int = 5,
    warmup: int = 2,
    show_progress: bool = True,
    threads: int | None = RUNTIME_THREADS,
    allocator_limit: int | None = ALLOCATOR_LIMIT_BYTES,
) -> pd.DataFrame:
    """Profile every op of `spec` at each batch size; store the rows (and the steps) and return the rows.
    TF runs only in child processes (capture, tracing, timing): this one never holds a model's memory.
    `allocator_limit` caps what the timing child's TF allocator reserves (tag_core.profile.timing), None: no
    cap; a step that needs more is profiled again without it, with a warning."""
    from tqdm import tqdm

    if not batch_sizes or any(not isinstance(b, int) or b <= 0 for b in batch_sizes):
        raise TagInputError("batch_sizes", f"must be positive integers, got {batch_sizes!r}")
    if not isinstance(runs, int) or runs <= 0:
        raise TagInputError("runs", f"must be a positive integer, got {runs!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise TagInputError("warmup", f"must be a non-negative integer, got {warmup!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 0):
        raise TagInputError("threads", f"must be a non-negative integer or None, got {threads!r}")
    if allocator_limit is not None and (not isinstance(allocator_limit, int) or allocator_limit <= 0):
        raise TagInputError("allocator_limit", f"must be a positive integer (bytes) or None, got {allocator_limit!r}")
    graph = ensure_captured(conn, spec, batch_sizes)  # a new capture traces the batch sizes too
    op_names = [op.name for op in graph.ops]
    host = socket.gethostname()
    state_bytes = sum(v.bytes for v in graph.variables)
    step_files = ensure_step_files(spec, batch_sizes, state_bytes)
    inputs = [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype, "max_value": i.max_value}
              for i in [*spec.inputs, spec.label]]
    # A session's memory does not come back for the next one in the same process (vgg19: 3.7 GB at batch 2,
    # 5.1 GB after batches 2 and 4): a big model gets a child per batch size, a small one saves the start-ups.
    groups = [[b] for b in batch_sizes] if state_bytes > CHILD_TRACE_BYTES else [list(batch_sizes)]
    records = []
    with tqdm(total=len(batch_sizes) * runs, desc=f"profile {spec.name}", unit="run", disable=not show_progress) as bar:
        for group in groups:
            job = {"steps": [(b, str(step_files[b])) for b in group], "op_names": op_names, "inputs": inputs,
                   "runs": runs, "warmup": warmup, "threads": threads or 0, "cores": runtime_cores(threads),
                   "allocator_limit": allocator_limit}
            shown = bar.n
            try:
                done, started = _run_child(job, bar)
            except AllocatorLimitExceeded as exc:  # the step needs more than the budget: profile it anyway
                warnings.warn(f"profile {spec.name} at batch sizes {group}: {exc}; running it without the limit")
                bar.update(shown - bar.n)
                done, started = _run_child({**job, "allocator_limit": None}, bar)
            records.extend(done)
    device_type, version = started["device_type"], started["tf_version"]
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    frames, steps = [], []
    for r in records:
        overhead = op_overheads(np.array(r["execs"]), r["dispatch_us"], r["other_kernel_us"], r["other_nodes"])
        frames.append(pd.DataFrame({"op": op_names, "time_us": r["times"], "overhead_us": overhead,
                                    "batch_size": r["batch"], "run": r["run"]}))
        steps.append({k: r[k] for k in ("step_us", "kernel_us", "other_kernel_us", "nodes", "graph_nodes",
                                        "dispatch_us", "launch_us")} | {"batch_size": r["batch"], "run": r["run"]})
    frame = pd.concat(frames, ignore_index=True)
    frame["model"], frame["device_type"] = spec.name, device_type
    frame["host"], frame["tf_version"], frame["profiled_at"] = host, version, now
    frame = frame[["model", "op", "device_type", "batch_size", "run", "time_us", "host", "tf_version", "profiled_at",
                   "overhead_us"]]
    step_frame = pd.DataFrame(steps)
    step_frame["model"], step_frame["device_type"] = spec.name, device_type
    step_frame["threads"], step_frame["grappler"] = threads or 0, True
    step_frame["trace_level"] = "software" if device_type == "cpu" else "full"
    step_frame["host"], step_frame["tf_version"], step_frame["profiled_at"] = host, version, now
    store.replace_profiles(conn, frame, step_frame)
    return frame
