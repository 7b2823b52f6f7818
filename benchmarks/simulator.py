"""Simulator speed: evaluations per second on one core, with peak RSS.

For each model x topology, a fresh process pinned to one CPU core loads the captured
graph (and CPU profiles, when `tag profile` has stored some) from its own store
(--home, default .tag-bench/simulator, so it never waits on another benchmark's DuckDB lock), builds the Simulator once, then times repeated `Simulator.run` calls of a
strategy. Models not captured yet are captured first (`tag capture`, its own process).
Writes benchmarks/simulator.json; `--markdown` prints the table for results.md.

    python benchmarks/simulator.py [--models vgg19,transformer,resnet101] [--seconds 5]

Fidelity (`--fidelity mlp,small_cnn`): profile each model on this CPU at two batch sizes,
then compare the simulator's one-device step time (from that profile) with the measured
wall time of untraced steps, at the profiled batches and at one in between (interpolated).
Uses its own store under .tag-bench/fidelity; results merge into the same JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TAG = str(Path(sys.executable).parent / "tag")
# Goals from issue 3: ten times the TAG authors' Rust simulator on the 16-GPU testbed.
GOALS = {"vgg19": 30.0, "transformer": 6.0, "resnet101": 0.7}
AUTHORS = {"vgg19": 3.0, "transformer": 0.58, "resnet101": 0.07}
BATCH = 48  # the batch the authors' simulator figures were measured at

CHILD = r"""
import json, os, resource, statistics, sys, time
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
sys.path.insert(0, sys.argv[1])
from tag_core import store
from tag_core.capture import load_op_graph
from tag_core.search import baseline
from tag_core.simulate import Simulator
from tag_core.simulate import Strategy
from tag_core.cluster import load_topology
model, topo_file, batch, seconds, strategies = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), sys.argv[6].split(",")
conn = store.connect(read_only=True)
graph = load_op_graph(conn, model)
profiles = store.load_profiles(conn, model)
conn.close()
topo = load_topology(topo_file)
t = time.perf_counter()
sim = Simulator(graph, topo, profiles, batch_size=batch)
build = time.perf_counter() - t
out = {"ops": len(graph.ops), "edges": len(graph.edges), "devices": topo.num_devices, "build_s": build,
       "profiled_types": sim.compute.profiled_types, "strategies": {}}
for name in strategies:
    if name == "ps":
        s = Strategy.uniform(sim.n, topo.num_machines, topo.num_devices, "ps", name="ps")
    else:
        s = baseline(name, sim)
    first = time.perf_counter(); r = sim.run(s); first = time.perf_counter() - first
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 5:
        t = time.perf_counter(); sim.run(s); times.append(time.perf_counter() - t)
    times.sort()
    med = statistics.median(times)
    out["strategies"][name] = {
        "evals_per_s": 1.0 / med, "median_eval_ms": med * 1e3, "p10_eval_ms": times[len(times) // 10] * 1e3,
        "p90_eval_ms": times[(9 * len(times)) // 10] * 1e3, "first_eval_ms": first * 1e3, "evaluations": len(times),
        "simulated_slots": r.simulated_slots, "iteration_time_s": r.iteration_time_s, "oom": r.oom,
    }
out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


FIDELITY_CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from tag_core import store
from tag_core.cluster import CATALOG
from tag_core.capture import resolve_model
from tag_core.profile.profiler import _session
from tag_core.profile import initialise_randomly, profile_model
from tag_core.simulate import Simulator
from tag_core.simulate import Strategy
from tag_core.cluster import Machine, Topology
from tag_core.capture.trace import build_keras
from tag_core.capture import synthetic_batch, trace_step
model, profiled, evaluated = sys.argv[2], [int(b) for b in sys.argv[3].split(",")], [int(b) for b in sys.argv[4].split(",")]
spec = resolve_model(model)
conn = store.connect()
profile_model(conn, spec, profiled, runs=5, warmup=2, show_progress=False)
graph = load_op_graph(conn, spec.name)
profiles = store.load_profiles(conn, spec.name, "cpu")
conn.close()
host = Topology("host", (Machine("host", CATALOG["cpu"], 1, 100.0),), 100.0)
keras_objects = build_keras(spec)
rows = []
for b in evaluated:
    step = trace_step(spec, b, keras_objects)
    session = _session(step)  # the profiler's session settings: one op at a time
    initialise_randomly(session, step)
    feed = dict(zip(step.input_tensors, synthetic_batch(spec, b)))
    fetches = [step.loss_tensor, step.train_ops]
    for _ in range(3):
        session.run(fetches, feed_dict=feed)
    times = []
    for _ in range(7):
        t = time.perf_counter(); session.run(fetches, feed_dict=feed); times.append(time.perf_counter() - t)
    session.close()
    measured = statistics.median(times)
    sim = Simulator(graph, host, profiles, batch_size=b)
    predicted = sim.run(Strategy.uniform(len(graph.ops), 1, 1, "allreduce")).iteration_time_s
    rows.append({"batch_size": b, "profiled": b in profiled, "measured_s": measured, "predicted_s": predicted,
                 "error": (predicted - measured) / measured})
print(json.dumps({"model": spec.name, "ops": len(graph.ops), "profiled_batches": profiled, "rows": rows}))
"""


def fidelity(models: list[str], profiled: str, evaluated: str) -> list[dict]:
    env = {**os.environ, "TAG_HOME": str(ROOT / ".tag-bench" / "fidelity"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = []
    for model in models:
        print(f"fidelity {model} ...", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, "-c", FIDELITY_CHILD, str(ROOT), model, profiled, evaluated],
                              env=env, cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"fidelity {model} failed:\n{done.stderr[-3000:]}")
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"  {out[-1]['rows']}", file=sys.stderr, flush=True)
    return out


def ensure_captured(model: str, env: dict) -> None:
    code = ("import sys;from tag_core import store;c=store.connect();"
            "sys.exit(0 if store.captured_model(c, sys.argv[1]) else 1)")
    if subprocess.run([sys.executable, "-c", code, model], env=env, cwd=ROOT, capture_output=True).returncode:
        print(f"capturing {model} ...", file=sys.stderr, flush=True)
        done = subprocess.run([TAG, "capture", model], env=env, cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"capture {model} failed:\n{done.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vgg19,transformer,resnet101")
    parser.add_argument("--topologies", default="testbed,cloud")
    parser.add_argument("--strategies", default="dp-nccl,horovod,ps", help="dp-nccl is the benchmark; others for context")
    parser.add_argument("--seconds", type=float, default=5.0, help="timing window per strategy")
    parser.add_argument("--batch-size", type=int, default=BATCH)
    parser.add_argument("--out", default=str(HERE / "simulator.json"))
    parser.add_argument("--markdown", action="store_true", help="print a markdown table too")
    parser.add_argument("--home", default=str(ROOT / ".tag-bench" / "simulator"), help="TAG_HOME for the graphs")
    parser.add_argument("--fidelity", help="only the fidelity check, for these models (comma-separated)")
    parser.add_argument("--fidelity-profiled", default="2,8")
    parser.add_argument("--fidelity-evaluated", default="2,4,8")
    args = parser.parse_args()
    if args.fidelity:
        path = Path(args.out)
        report = json.loads(path.read_text()) if path.exists() else {}
        report["fidelity"] = fidelity(args.fidelity.split(","), args.fidelity_profiled, args.fidelity_evaluated)
        path.write_text(json.dumps(report, indent=2) + "\n")
        if args.markdown:
            print(fidelity_markdown(report["fidelity"]))
        return
    env = {**os.environ, "TAG_HOME": args.home,
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    rows = []
    for model in args.models.split(","):
        ensure_captured(model, env)
        for topo in args.topologies.split(","):
            topo_file = ROOT / "examples" / "topologies" / f"{topo}.json"
            print(f"{model} on {topo} ...", file=sys.stderr, flush=True)
            done = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), model, str(topo_file), str(args.batch_size),
                                   str(args.seconds), args.strategies], env=env, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{model}/{topo} failed:\n{done.stderr[-3000:]}")
            row = {"model": model, "topology": topo, **json.loads(done.stdout.strip().splitlines()[-1])}
            dp = row["strategies"]["dp-nccl"]["evals_per_s"]
            if topo == "testbed" and model in GOALS:
                row["goal_evals_per_s"] = GOALS[model]
                row["authors_rust_evals_per_s"] = AUTHORS[model]
                row["meets_goal"] = dp >= GOALS[model]
            rows.append(row)
            print(f"  dp-nccl {dp:.1f} evals/s, peak RSS {row['peak_rss_mib']:.0f} MiB", file=sys.stderr, flush=True)
    previous = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    report = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; runs pinned to one core",
        "python": platform.python_version(),
        "batch_size": args.batch_size,
        "timing_window_s": args.seconds,
        "results": rows,
    }
    if "fidelity" in previous:
        report["fidelity"] = previous["fidelity"]
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown:
        print(markdown(report))


def markdown(report: dict) -> str:
    lines = ["| model | topology | ops | devices | slots | dp-nccl evals/s | horovod evals/s | ps evals/s | build s | peak RSS MiB | goal |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        st = r["strategies"]
        get = lambda k: f"{st[k]['evals_per_s']:.1f}" if k in st else "–"  # noqa: E731
        slots = st["dp-nccl"]["simulated_slots"]
        goal = f"≥ {r['goal_evals_per_s']} ({'met' if r['meets_goal'] else 'MISSED'})" if "goal_evals_per_s" in r else ""
        lines.append(f"| {r['model']} | {r['topology']} | {r['ops']} | {r['devices']} | {slots} | {get('dp-nccl')} | "
                     f"{get('horovod')} | {get('ps')} | {r['build_s']:.2f} | {r['peak_rss_mib']:.0f} | {goal} |")
    return "\n".join(lines)


def fidelity_markdown(rows: list[dict]) -> str:
    lines = ["| model | ops | batch | profiled at | measured ms | predicted ms | error |", "|---|---|---|---|---|---|---|"]
    for m in rows:
        for r in m["rows"]:
            where = "this batch" if r["profiled"] else f"{m['profiled_batches']} (interpolated)"
            lines.append(f"| {m['model']} | {m['ops']} | {r['batch_size']} | {where} | {r['measured_s'] * 1e3:.2f} | "
                         f"{r['predicted_s'] * 1e3:.2f} | {r['error'] * 100:+.1f}% |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
