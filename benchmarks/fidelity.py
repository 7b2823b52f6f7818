"""Distributed fidelity: predicted against measured step times on the local cluster of `tag calibrate --local N`.

    python benchmarks/fidelity.py [--tasks N] [--models mlp,small_cnn,transformer] [--steps 30] [--rounds 5]
    python benchmarks/fidelity.py --only-probes    # the probes again, into the existing report

1. `tag calibrate --local N --out local.json` (N: --tasks, default every core this process may use, at least 2):
   N pinned single-core TF servers on 127.0.0.1, their transfers, collectives and fixed costs.
2. Per model, in a process of its own (wall time and peak RSS): `tag fidelity MODEL --topology local.json
   --batch-size B --json`: single, dp-nccl, dp-nccl-p, horovod, ps, model_parallel, duplicate, a METIS mix and
   a fresh TAG plan, each predicted with the calibration applied, emitted, and measured interleaved with the
   others on one pinned cluster (median of the timed steps; noise = their interquartile range).
3. Probes of the runtime on a fresh pinned cluster, for the terms the fidelity rows point at: a step's launch
   on task 0 (where the master and the client's feeds are) against one on another task, K independent
   all-reduces or transfers in one step against the K-fold cost the simulator charges (one at a time), and
   whether all-reduces progress while the tasks compute (the simulator lets them overlap whole).

Writes benchmarks/fidelity_distributed.json and benchmarks/fidelity_distributed.md (not fidelity.json:
benchmarks/simulator.py owns that). $TAG_HOME defaults to a fresh temporary folder.
Targets (issue 20): Spearman >= 0.8 for every model, median |error| <= 20%, TAG no slower than the fastest
measured alternative within the noise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TAG = str(Path(sys.executable).parent / "tag")
MODELS = {  # the small sizes that fit this machine; the transformer's layers=1 is one encoder and one decoder block
    "mlp": ("mlp", 128),
    "small_cnn": ("small_cnn", 32),
    "transformer": ("transformer[layers=1,d_model=64,heads=4,ff=128,vocab=1000,seq_len=16]", 32),
}
# Runs `argv` as a child and prints its wall time and the peak RSS of the largest process below it.
WRAPPER = ("import json,resource,subprocess,sys,time;t=time.perf_counter();"
           "c=subprocess.run(sys.argv[1:],capture_output=True,text=True);"
           "print(json.dumps({'rc':c.returncode,'wall_s':time.perf_counter()-t,'out':c.stdout,'err':c.stderr[-4000:],"
           "'peak_rss_mib':resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1024}))")


def wrapped(argv: list[str], env: dict) -> dict:
    result = subprocess.run([sys.executable, "-c", WRAPPER, *argv], env=env, capture_output=True, text=True)
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=max(2, len(os.sched_getaffinity(0))))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-probes", action="store_true")
    parser.add_argument("--only-probes", action="store_true",
                        help="run the probes again into the existing fidelity_distributed.json, keeping its models")
    parser.add_argument("--probe-child", action="store_true", help=argparse.SUPPRESS)  # runs the probes, prints JSON
    args = parser.parse_args()
    if args.probe_child:
        sys.path.insert(0, str(HERE.parent))
        import tag_core.runtime  # noqa: F401  joins the parent's loopback namespace before TF starts threads

        print(json.dumps(probes()))
        return
    if args.only_probes:
        report = json.loads((HERE / "fidelity_distributed.json").read_text())
        write(report | {"probes": run_probes(os.environ)})
        return
    home = os.environ.get("TAG_HOME") or tempfile.mkdtemp(prefix="tag-fidelity-bench-")
    Path(home).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TAG_HOME": home}
    topology = Path(home) / f"local-{args.tasks}.json"
    say(f"calibrating {args.tasks} local tasks (TAG_HOME={home})")
    calibration = wrapped([TAG, "calibrate", "--local", str(args.tasks), "--out", str(topology), "--quiet", "--json"],
                          env)
    if calibration["rc"] != 0:
        raise SystemExit(f"tag calibrate failed:\n{calibration['err']}")
    commit = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    report = {"machine": f"{platform.machine()}, {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), "
                         "shared with other jobs", "commit": commit, "tasks": args.tasks, "steps": args.steps,
              "rounds": args.rounds,
              "calibration": {**json.loads(calibration["out"]), "wall_s": calibration["wall_s"],
                              "peak_rss_mib": calibration["peak_rss_mib"]},
              "models": []}
    for key in args.models.split(","):
        reference, batch = MODELS[key]
        say(f"{key}: tag fidelity {reference} --batch-size {batch}")
        load = os.getloadavg()[0]
        run = wrapped([TAG, "fidelity", reference, "--topology", str(topology), "--batch-size", str(batch),
                       "--steps", str(args.steps), "--rounds", str(args.rounds), "--profile-after", "--calibrate-after",
                       "--json"], env)
        if not run["out"].strip():
            raise SystemExit(f"tag fidelity {reference} failed:\n{run['err']}")
        fidelity = json.loads(run["out"])
        report["models"].append({"key": key, "reference": reference, "batch_size": batch, "rc": run["rc"],
                                 "wall_s": run["wall_s"], "peak_rss_mib": run["peak_rss_mib"],
                                 "load_before": load, "load_after": os.getloadavg()[0], **fidelity})
        say(f"{key}: Spearman {fidelity['spearman']}, median |error| {fidelity['median_abs_error']}")
    if not args.no_probes:
        report["probes"] = run_probes(env)
    write(report)


def run_probes(env: dict) -> dict:
    say("probing the runtime")
    sys.path.insert(0, str(HERE.parent))
    from tag_core.runtime.loopback import child_environment, loopback_namespace

    # The probe's client must share its servers' network: the child joins this namespace (only lo up)
    # and starts its servers in it, without one of their own (TAG_NETNS=off inside).
    with loopback_namespace():
        probe_env = {**env, **child_environment(), "TAG_NETNS": "off"}
        probe = subprocess.run([sys.executable, __file__, "--probe-child"], env=probe_env, capture_output=True,
                               text=True)
    return json.loads(probe.stdout) if probe.returncode == 0 else {"error": probe.stderr[-2000:]}


def write(report: dict) -> None:
    (HERE / "fidelity_distributed.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (HERE / "fidelity_distributed.md").write_text(markdown(report))
    print(markdown(report))


def say(text: str) -> None:
    print(f"fidelity benchmark: {text}", file=sys.stderr, flush=True)


def _before_only(rows: list[dict]) -> str:
    """Spearman and median |error| of the predictions from the profile before the measurement alone."""
    from tag_core.plan.measured_error import median_abs_error
    from tag_core.runtime.measure import spearman

    done = [(r["predicted_before_s"], r["measured_s"]) for r in rows
            if r.get("predicted_before_s") is not None and r["measured_s"] is not None]
    if not done:
        return "-"
    rho = spearman([p for p, _ in done], [m for _, m in done])
    return f"{'undefined' if rho is None else format(rho, '.2f')}, {median_abs_error(done):.0%}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def markdown(report: dict) -> str:
    c = report["calibration"]
    lines = ["# Distributed fidelity: predicted against measured step times", "",
             f"Written by `python benchmarks/fidelity.py` (raw figures in `benchmarks/fidelity_distributed.json`) "
             f"at commit {report.get('commit') or 'unknown'}. Machine: {report['machine']}. Cluster: `tag calibrate "
             f"--local {report['tasks']}` ({report['tasks']} "
             f"TF server processes on 127.0.0.1, each pinned to its own core with one thread), calibration "
             f"{c['calibration_hash']} in {c['wall_s']:.0f} s (peak RSS {c['peak_rss_mib']:.0f} MiB).",
             "",
             f"Each model: `tag fidelity MODEL --topology local-{report['tasks']}.json --batch-size B --steps "
             f"{report['steps']} --rounds {report['rounds']} --profile-after --calibrate-after`. Predicted: the "
             f"simulator from the model's profiles taken after each round of the measurement, while it waited, and "
             f"one calibration fitted to the samples of `tag calibrate --local` run again at the same times "
             f"('before only': from the profile and the calibration before the measurement, as `tag emit` "
             f"records it in plan.json). Measured: the median of "
             f"{report['steps']} timed steps after 3 warm-up steps, the strategies interleaved over "
             f"{report['rounds']} rounds on one pinned cluster so that load changes hit them alike. Noise: the "
             f"interquartile range (IQR) of the timed steps. Error: (predicted - measured) / measured. TAG "
             f"verdict: the TAG plan's median against the fastest other "
             f"strategy's, within the larger of the two IQRs. Targets (issue 20): Spearman >= 0.8, median |error| "
             f"<= 20%.", "",
             "| model | batch | strategies | Spearman | median abs error | before only | TAG vs fastest alternative | "
             "wall s | peak RSS MiB | load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m in report["models"]:
        rho = "undefined" if m["spearman"] is None else f"{m['spearman']:.2f}"
        error = "-" if m["median_abs_error"] is None else f"{m['median_abs_error']:.0%}"
        verdict = m.get("tag_against_best")
        tag = "-" if not verdict else (
            f"{'no slower' if verdict['no_slower_within_noise'] else 'SLOWER'}: {_ms(verdict['tag_s'])} against "
            f"{verdict['best_alternative']} {_ms(verdict['best_s'])} ms (noise {_ms(verdict['noise_s'])} ms)")
        measured = sum(r["measured_s"] is not None for r in m["rows"])
        lines.append(f"| {m['reference']} | {m['batch_size']} | {measured} of {len(m['rows'])} | {rho} | {error} | "
                     f"{_before_only(m['rows'])} | {tag} | {m['wall_s']:.0f} | {m['peak_rss_mib']:.0f} | "
                     f"{m['load_before']:.1f} -> {m['load_after']:.1f} |")
    for m in report["models"]:
        lines += ["", f"## {m['reference']}, batch {m['batch_size']}", "",
                  "Terms: the prediction's busiest device (compute) and its communication by kind (ms, charged one "
                  "at a time per link); emitted: ops per task, tensors and control edges crossing tasks, "
                  "collective ops.", "",
                  *_weighed(m.get("measured_error")),
                  *_profile_steps(m.get("profile_steps")),
                  *_calibrations_during(m.get("calibrations_during"), m.get("calibration")),
                  "| strategy | predicted ms | measured ms | IQR ms | error | terms (ms) | emitted |",
                  "|---|---|---|---|---|---|---|"]
        for r in m["rows"]:
            terms = ", ".join(f"{k.replace('_s', '')} {v * 1e3:.2f}" for k, v in (r.get("terms") or {}).items())
            e = r.get("emitted") or {}
            emitted = (f"ops {e['ops_per_task']}, {e['cross_task_tensors']} tensors + {e['cross_task_control_edges']} "
                       f"control edges across, {e['collectives']} collectives") if e else "-"
            error = f"{r['relative_error']:+.0%}" if r.get("relative_error") is not None else r.get("error", "-")
            lines.append(f"| {r['strategy']} | {_ms(r['predicted_s'])} | {_ms(r['measured_s'])} | "
                         f"{_ms(r['spread_s'])} | {error} | {terms} | {emitted} |")
    lines += ["", *calibration_lines(c), *probe_lines(report.get("probes"))]
    return "\n".join(lines) + "\n"


def _weighed(error: dict | None) -> list[str]:
    """What the TAG row's search weighed: the error of the steps measured before it in this run."""
    if not error:
        return []
    return [f"The TAG plan kept a distributed strategy only if predicted faster than one device by more than the "
            f"median |error| of the {error['steps']} steps measured before it on this cluster: "
            f"{error['median_abs_error']:.0%}.", ""]


def _profile_steps(steps: list[dict] | None) -> list[str]:
    """How fast the machine ran each profile: its ops added up, per batch size."""
    if not steps:
        return []
    lines = []
    for batch in sorted({s["batch_size"] for s in steps}):
        each = ", ".join(f"{s['profile']} {_ms(s['step_s'])}" for s in steps if s["batch_size"] == batch)
        lines.append(f"Profiles' steps at batch {batch} (ops added up, ms): {each}.")
    return [" ".join(lines), ""]


def _calibrations_during(calibrations: list[dict] | None, pooled: str | None) -> list[str]:
    """How the runtime's fixed costs moved over the measurement: each calibration's headline terms."""
    if not calibrations:
        return []
    each = []
    for c in calibrations:
        if "hash" not in c:
            each.append(f"{c['calibration']} failed ({c.get('error', '')})")
            continue
        launches = " / ".join(f"{_ms(s)}" for _, s in sorted(c["step_s_by_tasks"].items(), key=lambda kv: int(kv[0])))
        each.append(f"{c['calibration']} {launches} ms, hides {c['compute_overlap']:.0%}")
    return [f"Calibrations during the measurement (step launch by tasks touched; share of transfers compute "
            f"hides): {'; '.join(each)}. Predictions use {pooled or 'no'} fitted to all of their samples.", ""]


def _optional_ms(seconds: float | None) -> str:
    return "not measured" if seconds is None else f"{seconds * 1e3:.3f} ms"


def calibration_lines(c: dict) -> list[str]:
    o = c["overheads"]
    lines = ["## The calibration's terms", "",
             f"Overheads: per op {o['per_op_s'] * 1e6:.2f} us, per step {o['per_step_s'] * 1e3:.3f} ms, per send/recv "
             f"pair {o['per_transfer_s'] * 1e3:.3f} ms; share of transfers the tasks' compute hides: "
             f"{'not measured' if o.get('compute_overlap') is None else format(o['compute_overlap'], '.0%')}; "
             f"each more independent transfer: {_optional_ms(o.get('transfer_gap_s'))}; a sender that has just begun "
             f"computing holds a transfer: {_optional_ms(o.get('busy_send_s'))}.",
             "", "| fit | latency ms | Gbit/s |", "|---|---|---|"]
    for link, fit in c["links"].items():
        lines.append(f"| p2p {link} | {fit['latency_s'] * 1e3:.3f} | {fit['gbps']:.3g} |")
    for kind, by_link in c["collectives"].items():
        for link, sizes in by_link.items():
            for size, fit in sizes.items():
                lines.append(f"| {kind} {link} x{size} | {fit['latency_s'] * 1e3:.3f} | {fit['gbps']:.3g} |")
    steps = [r for r in c.get("measured", []) if r["kind"] == "step"]
    if steps:
        lines += ["", "Measured step launches: " + ", ".join(
            f"{r['group_size']} task(s) {r['median_s'] * 1e3:.3f} ms" for r in steps) + "."]
    return lines


def probe_lines(probes: dict | None) -> list[str]:
    if not probes:
        return []
    if "error" in probes:
        return ["", "## Probes", "", f"The probes failed: {probes['error'][-500:]}"]
    lines = ["", "## Probes of the runtime", "",
             "Medians over 60 runs on a fresh pinned cluster; each step's inputs are made where they are used "
             "(no feeds) unless it says 'fed'.", "", "| probe | median ms | IQR ms |", "|---|---|---|"]
    for p in probes["rows"]:
        lines.append(f"| {p['label']} | {p['median_s'] * 1e3:.3f} | {p['iqr_s'] * 1e3:.3f} |")
    return lines


# ---------------------------------------------------------------- probes (run in a child process)

PROBE_RUNS = 60
KS = (1, 6, 24)


def probes() -> dict:
    """Step launches by task, and K independent all-reduces or transfers in one step, on 2 pinned tasks."""
    sys.path.insert(0, str(HERE.parent))
    import numpy as np
    import tensorflow as tf

    from tag_core.runtime.calibration_graphs import session_config
    from tag_core.runtime.local_cluster import local_cluster, session_target

    tf.compat.v1.disable_eager_execution()
    devices = [f"/job:worker/task:{k}/device:CPU:0" for k in range(2)]
    rows, instance = [], [0]

    def timed(label: str, build) -> None:
        graph = tf.Graph()
        with graph.as_default():
            fetch, feed = build()
        session = tf.compat.v1.Session(target, graph=graph, config=session_config(60.0))
        for _ in range(5):
            session.run(fetch, feed)
        times = []
        for _ in range(PROBE_RUNS):
            start = time.perf_counter()
            session.run(fetch, feed)
            times.append(time.perf_counter() - start)
        session.close()
        rows.append({"label": label, "median_s": float(np.median(times)),
                     "iqr_s": float(np.percentile(times, 75) - np.percentile(times, 25))})

    def fed_step(task: int):
        def build():
            with tf.device(devices[task]):
                x = tf.compat.v1.placeholder(tf.float32, [4])
                return tf.reduce_sum(x * 2.0), {x: np.ones(4, np.float32)}
        return build

    def both():
        outs = []
        for device in devices:
            with tf.device(device):
                outs.append(tf.reduce_sum(tf.random.uniform([4])))
        return outs, None

    def all_reduce(values: list | None) -> list:
        """One 2-task all-reduce of values[k] on task k (None: a fresh 4 KB tensor on each), a new instance."""
        instance[0] += 1
        out = []
        for k, device in enumerate(devices):
            with tf.device(device):
                out.append(tf.raw_ops.CollectiveReduceV2(
                    input=tf.random.uniform([1024]) if values is None else values[k], group_size=tf.constant(2),
                    group_key=tf.constant(1), instance_key=tf.constant(instance[0]), ordering_token=[],
                    merge_op="Add", final_op="Id"))
        return out

    def allreduces(k: int):
        def build():
            outs = [value for _ in range(k) for value in all_reduce(None)]
            with tf.device(devices[0]):
                return tf.group(*outs), None
        return build

    def transfers(k: int, source: int):
        def build():
            with tf.device(devices[source]):
                made = [tf.random.uniform([1024]) for _ in range(k)]
            with tf.device(devices[0]):
                return tf.add_n([tf.reduce_sum(tf.identity(x)) for x in made]), None
        return build

    def chains_and_allreduces(chains: bool, allreduce: bool):
        """300 chained 64 x 64 matmuls on each task, 4 chained 4 KB all-reduces, or both, independent, in one
        step: does a collective progress while the single-threaded tasks compute?"""
        def build():
            outs = []
            for device in devices:
                with tf.device(device):
                    x = tf.random.uniform([64, 64])
                    for _ in range(300 if chains else 1):
                        x = tf.matmul(x, x)
                    outs.append(x)
            values = None
            for _ in range(4 if allreduce else 0):
                values = all_reduce(values)
            with tf.device(devices[0]):
                return tf.group(*outs, *(values or [])), None
        return build

    def after_compute(allreduce: bool):
        """Three 256 x 256 matmuls on each task, then 8 independent 4 KB all-reduces of slices of the result (or
        the slices alone): do collectives that wait for compute cost what the independent ones above do?"""
        def build():
            slices, outs = [], []
            for device in devices:
                with tf.device(device):
                    x = tf.random.uniform([256, 256])
                    for _ in range(3):
                        x = tf.matmul(x, x) * 0.001
                    slices.append([tf.reshape(x[4 * i:4 * i + 4], [-1]) for i in range(8)])  # distinct: no CSE
            for i in range(8):
                outs += all_reduce([slices[0][i], slices[1][i]]) if allreduce else [slices[0][i], slices[1][i]]
            with tf.device(devices[0]):
                return tf.group(*outs), None
        return build

    def fed_matmul():
        with tf.device(devices[0]):
            x = tf.compat.v1.placeholder(tf.float32, [128, 784])
            return tf.reduce_sum(tf.matmul(x, tf.random.uniform([784, 256]))), {x: np.ones((128, 784), np.float32)}

    with local_cluster(2) as cluster:
        target = session_target(cluster.target(0), cluster.client_cluster)
        timed("step on task 0 only: a 128 x 784 batch fed, one matmul", fed_matmul)
        # The client that feeds and drives the step has no core of its own when every core runs a task.
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            os.sched_setaffinity(spinner.pid, {cluster.servers[1].core})
            timed("the same while a process keeps task 1's core busy", fed_matmul)
        finally:
            spinner.kill()
            spinner.wait()
        timed("step on task 0 (the master's), fed 4 floats, fetched", fed_step(0))
        timed("step on task 1, fed 4 floats, fetched through task 0", fed_step(1))
        timed("step with an op on each task, both fetched", both)
        for k in KS:
            timed(f"{k} independent 4 KB all-reduces over tasks 0 and 1", allreduces(k))
        for k in KS:
            timed(f"{k} independent 4 KB transfers task 1 -> task 0", transfers(k, 1))
        timed(f"{KS[-1]} of the same 4 KB tensors made on task 0 (no transfer)", transfers(KS[-1], 0))
        timed("a matmul on each task (the base of the next three)", chains_and_allreduces(False, False))
        timed("300 chained 64 x 64 matmuls on each task", chains_and_allreduces(True, False))
        timed("4 chained 4 KB all-reduces over tasks 0 and 1", chains_and_allreduces(False, True))
        timed("both in one step, independent (overlap: the larger; none: the sum)", chains_and_allreduces(True, True))
        timed("3 256 x 256 matmuls on each task, 8 slices of 4 KB", after_compute(False))
        timed("the same, each slice all-reduced (8 independent all-reduces)", after_compute(True))
    return {"rows": rows, "runs": PROBE_RUNS}


if __name__ == "__main__":
    main()
