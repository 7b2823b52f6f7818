"""The process the profiler times a training step in, set up the way a device of the runtime runs one.

`profile_model` (tag_core.profile.profiler) starts `python -m tag_core.profile.timing JOB` and reads its
output file. A process of its own because TensorFlow sizes its thread pools once per process, from the
first session it creates: a session made later with other settings keeps the first one's pools. So,
before TensorFlow starts, this process pins itself to the job's cores and sets TF's pool sizes as a device
of the local runtime has them (`pool_sizes`: with `threads` 1, one intra-op and two inter-op threads on one
core, as tag_core.runtime.local_cluster serves each device of a local cluster and `tag run` a one-device
graph; 0 keeps TF's defaults). Two inter-op threads on one core contend: the step of mlp at batch 128 took
3.4 ms with one and 3.8 ms with two, as long as on a server (small_cnn at 32: 7.9, 8.5 and 8.8 ms). The step runs
as the runtime runs an emitted step: Grappler on, one train target (a NoOp after every update, as the
emitted `tag/train`), not the ~thousand update ops as separate fetch targets (whose handling alone cost
26 ms a step on mobilenet_v2 here).

For each batch size, after the warm-up, each recorded run is three measurements in turn:

1. the step untraced: its wall-clock time (`step_us`, the median of three), what a step of the runtime costs;
2. session.run of a trivial op in the same session (`launch_us`): launching a step, which the runtime's
   own launch cost (a calibration's per-step term, tag_core.simulate.comm) stands for;
3. the step traced: each node's time from `step_stats` (GPU kernel times, "stream:all", win over host
   times), which OpGraph op each node belongs to, and how often each ran.

Node stats time kernels only. The rest of the untraced step, step - launch - traced node time, is the
executor's own work around the kernels (dispatching each node, handing tensors on, freeing them, the
constants and handles the OpGraph leaves out) net of what tracing adds inside the kernels; the profiler
spreads it over the OpGraph ops per node each ran (`overhead_us`, tag_core.profile.profiler). A chain of
trivial scalar ops dispatches at 0.15-0.3 µs a node here, well under the 0.7-1.6 µs a node of real steps:
the cost is the real nodes' own, so it is measured on the step itself.

Memory: TF's oneDNN CPU build keeps tensors of 256 KiB and up in a BFC allocator that reserves regions of
doubling size, never gives their pages back, and picks free chunks best-fit by size, not by whether their
pages were touched: over a few steps it touches most of what it reserved. vgg19 at batch 4 touched 4.2 GB
for a step whose tensors peak at 2.8-3.1 GB (4917 MiB RSS; 1.3 GB of it pages nothing used any more). A job's
`allocator_limit` (bytes, TF_MKL_ALLOC_MAX_BYTES) bounds what it may reserve: the same allocator makes the
same best-fit choices within fewer regions, so the step's kernels and times do not change. A step that needs
more fails with OUT_OF_MEMORY, and the profiler runs it again without the limit.

Output: one JSON line per (batch, run) in the job's `out` file; progress lines {"event": "run", ...} on stdout.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

UNTRACED_REPEATS = 3  # untraced steps per recorded run; their median is its step time (load spikes happen)
LAUNCH_REPEATS = 5  # trivial runs per recorded run; their median is its launch cost
TRAIN_TARGET = "tag_profile/train"
ALLOCATOR_LIMIT_ENV = "TF_MKL_ALLOC_MAX_BYTES"  # read once, when TF's oneDNN CPU allocator starts


def pool_sizes(threads: int) -> tuple[int, int]:
    """(intra-op, inter-op) threads of a runtime device that computes with `threads` threads. The inter-op
    pool has one more (tag_core.runtime.local_cluster.server_config says why), so a profile runs with both."""
    return threads, threads + 1


def pin(cores: list[int] | None, threads: int) -> None:
    """Before TensorFlow starts: pin this process (every thread TF starts inherits it) and size TF's pools."""
    if cores:
        os.sched_setaffinity(0, set(cores))
    if threads:
        intra, inter = pool_sizes(threads)
        os.environ.update({"OMP_NUM_THREADS": str(intra), "TF_NUM_INTRAOP_THREADS": str(intra),
                           "TF_NUM_INTEROP_THREADS": str(inter)})


def limit_allocator(limit_bytes: int | None) -> None:
    """Before TensorFlow starts: cap what its CPU allocator may reserve (see the module docstring); None: no
    cap. A limit the user set in the environment wins."""
    if limit_bytes:
        os.environ.setdefault(ALLOCATOR_LIMIT_ENV, str(int(limit_bytes)))


def init_chunk_bytes() -> int:
    """The initialisation's feed size (profiler.INIT_CHUNK_BYTES), or a quarter of the allocator limit this process
    runs under: feeds near the limit leave TF's allocator waiting and retrying (a 4 MB limit on mlp's profile:
    22 s longer with 64 MB feeds)."""
    from .profiler import INIT_CHUNK_BYTES

    limit = os.environ.get(ALLOCATOR_LIMIT_ENV, "").strip()
    return min(INIT_CHUNK_BYTES, int(limit) // 4) if limit.isdigit() else INIT_CHUNK_BYTES


def node_times(run_metadata) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    """(time per node in µs, host time per node, host executions per node). GPU kernel times (stream:all) win
    over host times; per-stream duplicates of stream:all are skipped. A node inside a loop runs (and is
    dispatched) once per iteration."""
    host, streams, counts = defaultdict(float), defaultdict(float), defaultdict(int)
    for device in run_metadata.step_stats.dev_stats:
        if "stream:" in device.device and "stream:all" not in device.device:
            continue
        target = streams if "stream:all" in device.device else host
        for node in device.node_stats:
            name = node.node_name.split(":")[0]
            target[name] += max(node.op_end_rel_micros - node.op_start_rel_micros, 0)
            if target is host:
                counts[name] += 1
    return {**host, **streams}, dict(host), dict(counts)


def owner(name: str, known: set[str], cache: dict[str, str | None]) -> str | None:
    """The OpGraph op a node the executor ran belongs to: itself, else the op its name is scoped under (a
    variable handle ".../ReadVariableOp/resource", a lowered loop's body "while/body/...", a Grappler rewrite
    "op/ArithmeticOptimizer/..."), else None (constants and other free nodes, shared by all ops)."""
    if name in cache:
        return cache[name]
    found, scope = None, name
    while True:
        if scope in known:
            found = scope
            break
        if "/" not in scope:
            break
        scope = scope.rsplit("/", 1)[0]
    cache[name] = found
    return found


def launch_time(session, trivial) -> float:
    """µs of session.run of a trivial op in `session`: the median of LAUNCH_REPEATS runs."""
    times = []
    for _ in range(LAUNCH_REPEATS):
        start = time.perf_counter()
        session.run(trivial)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def config(tf, threads: int):
    """The runtime's session settings: its pool sizes (0: TF's defaults) and Grappler on, as it runs steps."""
    cfg = tf.compat.v1.ConfigProto()
    if threads:
        cfg.intra_op_parallelism_threads, cfg.inter_op_parallelism_threads = pool_sizes(threads)
    return cfg


def profile_batch(tf, job: dict, batch: int, meta_file: str, out, options) -> None:
    from tag_core.capture.models.spec import InputSpec, ModelSpec
    from tag_core.capture.steps import load_step
    from tag_core.capture.trace import synthetic_batch

    from .profiler import initialise_randomly

    step = load_step(meta_file)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(step.graph_def, name="")
        train = tf.group(*[graph.get_operation_by_name(n) for n in step.train_ops], name=TRAIN_TARGET)
        trivial = tf.constant(0.0, name="tag_profile/trivial")
    session = tf.compat.v1.Session(graph=graph, config=config(tf, job["threads"]))
    op_names = job["op_names"]
    known, owners = set(op_names), {}
    try:
        initialise_randomly(session, step, chunk_bytes=init_chunk_bytes())
        specs = [InputSpec(i["name"], tuple(i["shape"]), i["dtype"], i["max_value"]) for i in job["inputs"]]
        spec = ModelSpec(name=step.model, build=lambda: None, inputs=specs[:-1], label=specs[-1])
        feed = dict(zip(step.input_tensors, synthetic_batch(spec, batch)))
        fetches = [step.loss_tensor, train]
        for _ in range(job["warmup"]):
            session.run(fetches, feed_dict=feed)
        for run in range(job["runs"]):
            untraced = []
            for _ in range(UNTRACED_REPEATS):
                start = time.perf_counter()
                session.run(fetches, feed_dict=feed)
                untraced.append((time.perf_counter() - start) * 1e6)
            step_us = statistics.median(untraced)
            metadata = tf.compat.v1.RunMetadata()
            session.run(fetches, feed_dict=feed, options=options, run_metadata=metadata)
            launch = launch_time(session, trivial)
            times, host, counts = node_times(metadata)
            per_op, execs = defaultdict(float), defaultdict(int)
            other_kernel, other_nodes = 0.0, 0
            for name in set(times) | set(counts):
                op = owner(name, known, owners)
                if op is None:
                    other_kernel += host.get(name, 0.0)
                    other_nodes += counts.get(name, 0)
                else:
                    per_op[op] += times.get(name, 0.0)
                    execs[op] += counts.get(name, 0) or (name in times)
            kernel = float(sum(per_op.values()))
            nodes = int(sum(counts.values()))
            rest = step_us - launch - kernel - other_kernel  # the executor's work around the kernels, net
            record = {
                "batch": batch, "run": run, "times": [float(per_op.get(name, 0.0)) for name in op_names],
                "execs": [int(execs.get(name, 0)) for name in op_names], "step_us": step_us, "launch_us": launch,
                "kernel_us": kernel, "other_kernel_us": other_kernel, "nodes": nodes,
                "graph_nodes": int(sum(execs.values())), "other_nodes": other_nodes,
                "dispatch_us": rest / nodes if job["dispatch"] and nodes else None,
            }
            out.write(json.dumps(record) + "\n")
            out.flush()
            print(json.dumps({"event": "run", "batch": batch, "run": run}), flush=True)
    finally:
        session.close()


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    pin(job.get("cores"), job["threads"])
    limit_allocator(job.get("allocator_limit"))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    gpu = bool(tf.config.list_physical_devices("GPU"))
    # GPU kernel times need the device tracer (FULL_TRACE). On the CPU the lighter SOFTWARE_TRACE gives the
    # same node stats with less of the tracer's own time inside them (mobilenet_v2: 47.0 against 49.8 ms).
    level = tf.compat.v1.RunOptions.FULL_TRACE if gpu else tf.compat.v1.RunOptions.SOFTWARE_TRACE
    options = tf.compat.v1.RunOptions(trace_level=level)
    # A GPU runs its kernels while the host dispatches the next: there host time is not added to kernel time.
    job["dispatch"] = not gpu
    from .profiler import OUT_OF_MEMORY, detect_device_type

    # The profiler's own process does not start TF: the device type and TF's version come from here.
    print(json.dumps({"event": "start", "trace_level": "full" if gpu else "software", "gpu": gpu,
                      "cores": sorted(os.sched_getaffinity(0)), "threads": job["threads"],
                      "device_type": detect_device_type(), "tf_version": tf.__version__}), flush=True)
    with open(job["out"], "w") as out:
        for batch, meta_file in job["steps"]:
            try:
                profile_batch(tf, job, int(batch), meta_file, out, options)
            except tf.errors.ResourceExhaustedError as exc:
                if not os.environ.get(ALLOCATOR_LIMIT_ENV):
                    raise
                print(json.dumps({"event": "out_of_memory", "batch": int(batch),
                                  "limit": os.environ[ALLOCATOR_LIMIT_ENV], "error": str(exc)[:500]}), flush=True)
                return OUT_OF_MEMORY
    print(json.dumps({"event": "done"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
