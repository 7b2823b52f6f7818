"""The step a profile times against the step a server of the runtime runs: the thread pools a profile needs.

    python benchmarks/thread_pools.py [--models mlp,small_cnn,transformer] [--rounds 12] [--steps 10]

Per model: `tag emit MODEL --strategy single` on the topology of `tag calibrate --local 2`, then its emitted step,
with the batch as constants (no feed), is timed in three processes at once, round by round in turn (a change of
load hits each alike):

- server: a client of the local cluster, the step on task 0 (a server pinned to one core, one intra-op and two
  inter-op threads, as tag_core.runtime.local_cluster serves every task), less the median launch of a trivial
  step on the same task, taken in the same rounds;
- direct, 1 inter-op: a session in a process pinned to task 0's core, one intra-op and one inter-op thread (how
  the profiler timed steps before 10f60e3);
- direct, 2 inter-op: the same with two inter-op threads (tag_core.profile.timing.pool_sizes since then).

Each figure is the median over the rounds of each round's median step. Writes benchmarks/thread_pools.json and
benchmarks/thread_pools.md, with the peak RSS of each process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = {  # as benchmarks/fidelity.py runs them
    "mlp": ("mlp", 128),
    "small_cnn": ("small_cnn", 32),
    "transformer": ("transformer[layers=1,d_model=64,heads=4,ff=128,vocab=1000,seq_len=16]", 32),
}
WAYS = {"server": None, "direct, 1 inter-op": 1, "direct, 2 inter-op": 2}


def child(folder: str, inter: int | None, core: int, client_args: list[str]) -> None:
    """Load the emitted step; on each line "N" from stdin, time N steps and 5 trivial launches; print their medians."""
    if inter is not None:  # pinned before TensorFlow starts: its threads inherit the mask
        os.sched_setaffinity(0, {core})
        os.environ.update({"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": str(inter)})
    else:
        import tag_core.runtime  # noqa: F401  (joins the local run's network namespace while single-threaded)
    import numpy as np
    import tensorflow as tf

    from tag_core.capture.trace import synthetic_batch
    from tag_core.runtime.worker import _config, _load_graph_def, _spec_like, initial_values

    tf.compat.v1.disable_eager_execution()
    path = Path(folder)
    plan = json.loads((path / "plan.json").read_text())
    meta = plan["emission"]
    batch = synthetic_batch(_spec_like(meta), plan["batch_size"], seed=0)
    graph_def = _load_graph_def(path, meta, 600, False)
    device = next(n.device for n in graph_def.node if n.name == meta["input_tensors"][0].split(":")[0])
    if inter is not None:
        for node in graph_def.node:
            node.device = ""
    graph = tf.Graph()
    with graph.as_default():
        with tf.device(device if inter is None else None):
            inputs = {name: tf.constant(value) for name, value in zip(meta["input_tensors"], batch)}
            trivial = tf.constant(0.0) * 2.0
        tf.compat.v1.import_graph_def(graph_def, input_map=inputs, name="")
    if inter is None:
        from tag_core.runtime.local_cluster import session_target

        target = session_target(client_args[1], client_args[3] if len(client_args) > 3 else None)
        session = tf.compat.v1.Session(target, graph=graph, config=_config())
    else:
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=inter)
        session = tf.compat.v1.Session(graph=graph, config=config)
    session.run(meta["init_op"], feed_dict=dict(zip(meta["init_values"], initial_values(path, meta))))
    fetch = [meta["loss_tensor"], meta["train_op"]]
    for _ in range(5):
        session.run(fetch)
        session.run(trivial)
    print("ready", flush=True)
    for line in sys.stdin:
        steps, launches = [], []
        for _ in range(int(line)):
            start = time.perf_counter()
            session.run(fetch)
            steps.append(time.perf_counter() - start)
        for _ in range(5):
            start = time.perf_counter()
            session.run(trivial)
            launches.append(time.perf_counter() - start)
        print(json.dumps([float(np.median(steps)), float(np.median(launches))]), flush=True)
    print(json.dumps({"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)


def compare(folder: Path, rounds: int, steps: int) -> dict:
    from tag_core.runtime.local_cluster import child_env, local_cluster

    with local_cluster(2) as cluster:
        core = cluster.servers[0].core
        kids = {way: subprocess.Popen([sys.executable, __file__, "--child", str(folder), "--inter", str(inter or 0),
                                       "--core", str(core), "--", *cluster.client_args()],
                                      env=child_env(threads=None), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True)
                for way, inter in WAYS.items()}
        for way, kid in kids.items():
            if kid.stdout.readline().strip() != "ready":
                raise SystemExit(f"{folder.name}: the {way} process did not start")
        rows = {way: [] for way in kids}
        for _ in range(rounds):
            for way, kid in kids.items():
                kid.stdin.write(f"{steps}\n")
                kid.stdin.flush()
                rows[way].append(json.loads(kid.stdout.readline()))
        peaks = {}
        for way, kid in kids.items():
            kid.stdin.close()
            peaks[way] = json.loads(kid.stdout.readline())["peak_rss_mib"]
            kid.wait()
    out = {}
    for way, measured in rows.items():
        step, launch = statistics.median(m[0] for m in measured), statistics.median(m[1] for m in measured)
        out[way] = {"step_s": step, "launch_s": launch, "compute_s": step - launch, "peak_rss_mib": peaks[way]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--inter", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--core", type=int, help=argparse.SUPPRESS)
    parser.add_argument("client_args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.inter or None, args.core, args.client_args)
        return
    sys.path.insert(0, str(HERE.parent))
    home = tempfile.mkdtemp(prefix="tag-thread-pools-")
    env = {**os.environ, "TAG_HOME": home}
    tag = [sys.executable, "-m", "tag_core.cli"]
    topology = Path(home) / "local-2.json"
    subprocess.run([*tag, "calibrate", "--local", "2", "--out", str(topology), "--quiet"], env=env, check=True,
                   capture_output=True)
    commit = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    report = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "commit": commit, "rounds": args.rounds,
              "steps": args.steps, "models": []}
    for key in args.models.split(","):
        reference, batch = MODELS[key]
        folder = Path(home) / "emit" / key
        folder.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([*tag, "emit", reference, "--strategy", "single", "--topology", str(topology), "--device-kind",
                        "cpu", "--batch-size", str(batch), "--out", str(folder)], env=env, check=True,
                       capture_output=True)
        ways = compare(folder, args.rounds, args.steps)
        report["models"].append({"model": reference, "batch_size": batch, "ways": ways})
        print(f"{key}: " + ", ".join(f"{w} {v['compute_s'] * 1e3:.2f} ms" for w, v in ways.items()), file=sys.stderr)
    (HERE / "thread_pools.json").write_text(json.dumps(report, indent=2) + "\n")
    (HERE / "thread_pools.md").write_text(markdown(report))


def markdown(report: dict) -> str:
    lines = ["# Thread pools: the step a profile times against the step a server runs", "",
             f"Written by `python benchmarks/thread_pools.py` (raw figures in `benchmarks/thread_pools.json`) at "
             f"commit {report['commit']} on {report['machine']}. Each model's emitted single-device step, batch as "
             f"constants, in three processes timed in turn: {report['rounds']} rounds of {report['steps']} steps and "
             f"5 trivial launches each; medians over the rounds of each round's median. Compute = step - launch. "
             f"The server runs one intra-op and two inter-op threads on its core; the profiler now does too.", "",
             "| model | batch | server: step / launch / compute ms | direct, 1 inter-op: compute ms (vs server) | "
             "direct, 2 inter-op: compute ms (vs server) | peak RSS MiB (server client / 1 / 2) |",
             "|---|---|---|---|---|---|"]
    for m in report["models"]:
        s, one, two = (m["ways"][w] for w in WAYS)

        def versus(way: dict) -> str:
            return f"{way['compute_s'] * 1e3:.2f} ({way['compute_s'] / s['compute_s'] - 1:+.0%})"

        lines.append(f"| {m['model']} | {m['batch_size']} | {s['step_s'] * 1e3:.2f} / {s['launch_s'] * 1e3:.2f} / "
                     f"{s['compute_s'] * 1e3:.2f} | {versus(one)} | {versus(two)} | {s['peak_rss_mib']:.0f} / "
                     f"{one['peak_rss_mib']:.0f} / {two['peak_rss_mib']:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
