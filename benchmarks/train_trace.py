"""Where a `tag train` step's time goes, against Keras on one core: a trace on the local cluster's two tasks.

    python benchmarks/train_trace.py [--steps 200] [--traced 50]

benchmarks/train.md finds `tag train` with the TAG plan slower than Keras `fit` on one pinned core for the
three small models. This traces the same emitted step (the TAG plan of benchmarks/train.py's setup, fed the
same .npz batches) in a client of `local_cluster(2)`, as `tag train` runs it, and splits the step's wall time:

- step: `session.run([loss, train_op])` with the batch fed, as the trainer runs it (median of --steps);
- device spans: per task's device, first op start to last op end, from step_stats (FULL_TRACE: through the
  distributed master SOFTWARE_TRACE returns none; --traced steps); the step less the busiest span is the
  runtime's: the client's master dispatching the step to the tasks, the feed and the fetch crossing gRPC,
  and the step's set-up and tear-down (tracing slows a step, so the traced wall is shown but not used);
- empty run: a session.run of one constant on task 0 (the fixed cost of a step through the master);
- feed only: the batch fed to an Identity on task 0, its result not fetched back whole (a scalar of it);
- in-process graph: the same GraphDef, devices cleared, in a direct session of a process pinned to one core
  with one compute thread: the graph executor without the distributed runtime;
- Keras fit on one pinned core (benchmarks/keras_baselines.py keras_single), in the same run.

Writes benchmarks/train_trace.json and benchmarks/train_trace.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
MODELS = {"mlp": "mlp[features=64]", "small_cnn": "small_cnn[image_size=8]",
          "transformer": "transformer[layers=1,d_model=32,heads=2,ff=64,vocab=50,seq_len=8]"}
WARMUP = 20


def _median_ms(times: list[float]) -> float:
    return float(np.median(times)) * 1e3


def _timed(run, steps: int) -> list[float]:
    times = []
    for k in range(steps):
        start = time.perf_counter()
        run(k)
        times.append(time.perf_counter() - start)
    return times


def _batches(job: dict):
    from tag_core.capture.models import resolve_model
    from tag_core.train.data import load_data

    spec = resolve_model(job["model"])
    batch = json.loads((Path(job["graph"]) / "plan.json").read_text())["batch_size"]
    data = load_data(job["data"], spec, batch)
    batches = list(data.batches(0, 0, batch))
    return lambda k: batches[k % len(batches)]


def distributed_child(job: dict) -> dict:
    """Inside the namespace: the emitted step through the client's master, timed, traced and taken apart."""
    import tensorflow as tf

    from tag_core.runtime.local_cluster import session_target
    from tag_core.runtime.worker import Distributed, _load_graph_def, initial_values

    folder = Path(job["graph"])
    meta = json.loads((folder / "plan.json").read_text())["emission"]
    graph_def = _load_graph_def(folder, meta, 120.0, False)
    distributed = Distributed(graph_def, meta, session_target(job["target"], job["client_cluster"]), soft=False)
    batch_of = _batches(job)
    distributed.initialise(initial_values(folder, meta), None)
    first_input = meta["input_tensors"][0]
    with distributed.graph.as_default():
        placeholder = distributed.graph.get_tensor_by_name(first_input)
        with tf.device("/job:worker/replica:0/task:0/device:CPU:0"):
            constant = tf.constant(1.0)
            fed = tf.reduce_sum(tf.cast(tf.identity(placeholder), tf.float32))
    session = distributed.session

    def step(k):
        distributed.step(batch_of(k), None)

    _timed(step, WARMUP)
    step_times = _timed(step, job["steps"])
    empty = _timed(lambda k: session.run(constant), job["steps"])
    feed_only = _timed(lambda k: session.run(fed, feed_dict={first_input: batch_of(k)[0]}), job["steps"])
    traced_walls, spans, busy, ops = [], {}, {}, {}
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    for k in range(job["traced"]):
        metadata = tf.compat.v1.RunMetadata()
        feed = dict(zip(meta["input_tensors"], batch_of(k)))
        start = time.perf_counter()
        session.run([meta["loss_tensor"], meta["train_op"]], feed_dict=feed, options=options, run_metadata=metadata)
        traced_walls.append(time.perf_counter() - start)
        for device in metadata.step_stats.dev_stats:
            nodes = [n for n in device.node_stats if n.all_end_rel_micros >= 0]
            if not nodes:
                continue
            first = min(n.all_start_micros for n in nodes)
            last = max(n.all_start_micros + n.all_end_rel_micros for n in nodes)
            spans.setdefault(device.device, []).append((last - first) / 1e6)
            busy.setdefault(device.device, []).append(sum(n.all_end_rel_micros for n in nodes) / 1e6)
            ops[device.device] = len(nodes)
    return {"step_ms": _median_ms(step_times), "empty_run_ms": _median_ms(empty),
            "feed_only_ms": _median_ms(feed_only), "traced_step_ms": _median_ms(traced_walls),
            "devices": {d: {"span_ms": _median_ms(spans[d]), "busy_ms": _median_ms(busy[d]), "ops": ops[d]}
                        for d in sorted(spans)},
            "batch": json.loads((folder / "plan.json").read_text())["batch_size"],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def in_process_child(job: dict) -> dict:
    """The same GraphDef in a direct session on one pinned core: the executor without the runtime."""
    from tag_core.profile.timing import pin, pool_sizes

    pin([0], 1)
    import tensorflow as tf

    from tag_core.runtime.worker import Distributed, _load_graph_def, initial_values

    folder = Path(job["graph"])
    meta = json.loads((folder / "plan.json").read_text())["emission"]
    graph_def = _load_graph_def(folder, meta, 120.0, False)
    tasks = {node.device.split("/task:")[1].split("/")[0] for node in graph_def.node if "/task:" in node.device}
    if len(tasks) > 1:  # its collectives need a peer on another device; one core has no second task
        return {"step_ms": None, "peak_rss_mib": 0.0, "skipped": f"the step spans {len(tasks)} tasks"}
    for node in graph_def.node:
        node.device = ""
    local = {**meta, "variables": [{**v, "copies": [(h, "", s) for h, _, s in v["copies"]]}
                                   for v in meta["variables"]]}
    distributed = Distributed(graph_def, local, "", soft=True)
    intra, inter = pool_sizes(1)
    distributed.session = tf.compat.v1.Session(graph=distributed.graph, config=tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=intra, inter_op_parallelism_threads=inter, allow_soft_placement=True))
    batch_of = _batches(job)
    distributed.initialise(initial_values(folder, meta), None)
    _timed(lambda k: distributed.step(batch_of(k), None), WARMUP)
    times = _timed(lambda k: distributed.step(batch_of(k), None), job["steps"])
    return {"step_ms": _median_ms(times), "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def in_child(function: str, job: dict, env: dict | None = None) -> dict:
    # tag_core.runtime first: it joins the loopback namespace, which only a process without threads can.
    code = (f"import tag_core.runtime, json, sys; sys.path.insert(0, {str(HERE)!r}); import train_trace; "
            f"print('RESULT ' + json.dumps(train_trace.{function}(json.loads(sys.argv[1]))), flush=True)")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(job)], capture_output=True, text=True,
                          env=env or {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}, timeout=900)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{function} failed:\n{done.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def trace_model(env: dict, work: Path, key: str, model: str, plan: str, data: str, steps: int, traced: int) -> dict:
    from keras_baselines import keras_throughput
    from train import tag

    from tag_core.runtime.local_cluster import child_env, local_cluster

    graph = work / f"trace_graph_{key}"
    tag(env, "emit", model, "--plan", plan, "--device-kind", "cpu", "--out", str(graph), "--force")
    job = {"model": model, "graph": str(graph), "data": data, "steps": steps, "traced": traced}
    with local_cluster(2) as cluster:
        target, client_cluster = cluster.target(0), cluster.client_cluster
        distributed = in_child("distributed_child", {**job, "target": target, "client_cluster": client_cluster},
                               env={**child_env(None), "TAG_HOME": env["TAG_HOME"]})
    in_process = in_child("in_process_child", job)
    keras = keras_throughput(model, data, "keras_single", steps=steps, warmup=WARMUP)
    return {"model": model, "plan": plan, **distributed, "in_process_step_ms": in_process["step_ms"],
            "keras_single_step_ms": keras["median_step_s"] * 1e3,
            "peak_rss_mib": max(distributed["peak_rss_mib"], in_process["peak_rss_mib"], keras["peak_rss_mib"])}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown(report: dict) -> str:
    lines = ["# Where a `tag train` step goes", "",
             f"`python benchmarks/train_trace.py` at {report['commit']}, {report['started']}, on {report['cores']} "
             f"cores: the TAG plan's emitted step on `local_cluster(2)` as `tag train` runs it (medians of "
             f"{report['steps']} steps; device spans from {report['traced']} FULL_TRACE steps), against the "
             "same graph in one process and Keras fit on one pinned core.", "",
             "| model | batch | tag train step ms | busiest device span ms (ops) | outside the devices ms "
             "| empty run ms | feed only ms | in-process graph ms | Keras single ms | traced step ms | peak RSS MiB |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in report["rows"]:
        device, facts = max(row["devices"].items(), key=lambda d: d[1]["span_ms"])
        short = device.split("/job:")[-1].replace("/replica:0", "").replace("/device:", " ")
        lines.append(f"| {row['model']} | {row['batch']} | {row['step_ms']:.2f} | "
                     f"{facts['span_ms']:.2f} on {short} ({facts['ops']}) | {row['step_ms'] - facts['span_ms']:.2f} | "
                     f"{row['empty_run_ms']:.2f} | {row['feed_only_ms']:.2f} | {_ms(row['in_process_step_ms'])} | "
                     f"{row['keras_single_step_ms']:.2f} | {row['traced_step_ms']:.2f} | {row['peak_rss_mib']:.0f} |")
    lines += ["", "## Reading", ""]
    for row in report["rows"]:
        fixed = (f"A session.run with nothing to compute costs {row['empty_run_ms']:.2f} ms (client, master and task 0 "
                 f"over gRPC), and feeding the batch {row['feed_only_ms'] - row['empty_run_ms']:.2f} ms more.")
        if row["in_process_step_ms"] is None:
            lines.append(f"- {row['model']}: a step takes {row['step_ms']:.2f} ms through the distributed runtime "
                         f"against Keras' {row['keras_single_step_ms']:.2f} ms on one core; it spans several tasks, so "
                         f"no one-process graph compares. {fixed}")
            continue
        added = row["step_ms"] - row["in_process_step_ms"]
        faster = row["keras_single_step_ms"] / row["in_process_step_ms"]
        lines.append(f"- {row['model']}: the graph alone, in one process on one core, runs a step in "
                     f"{row['in_process_step_ms']:.2f} ms, {faster:.1f}x "
                     f"faster than Keras' {row['keras_single_step_ms']:.2f} ms; through the distributed runtime it "
                     f"takes {row['step_ms']:.2f} ms, {added:.2f} ms more. {fixed}")
    lines += ["", "Tracing slows a step (the traced step column), so device spans are upper bounds."]
    lines += ["", "Every device the trace saw:", ""]
    for row in report["rows"]:
        for device, facts in row["devices"].items():
            lines.append(f"- {row['model']}, {device}: span {facts['span_ms']:.2f} ms, ops busy "
                         f"{facts['busy_ms']:.2f} ms in all, {facts['ops']} ops")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--traced", type=int, default=50)
    args = parser.parse_args()
    from train import bench_home, prepare, say

    env, work, files = bench_home("tag-trace-bench-")
    _, plans, _, setup = prepare(env, work, files)
    rows = []
    for key, model in MODELS.items():
        say(f"trace: {model}")
        rows.append(trace_model(env, work, key, model, plans[key], files[key][0], args.steps, args.traced))
        say(f"  step {rows[-1]['step_ms']:.2f} ms, in-process {_ms(rows[-1]['in_process_step_ms'])} ms, "
            f"Keras {rows[-1]['keras_single_step_ms']:.2f} ms")
    report = {"machine": platform.node(), "cores": len(os.sched_getaffinity(0)), "steps": args.steps,
              "traced": args.traced, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "plans": setup["plans"],
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True).stdout.strip(), "rows": rows}
    (HERE / "train_trace.json").write_text(json.dumps(report, indent=1))
    (HERE / "train_trace.md").write_text(markdown(report))
    say(f"wrote {HERE / 'train_trace.md'}")


if __name__ == "__main__":
    main()
