"""Planning cost against cluster size: `plan(...)` with a wall-clock budget on random 3-type clusters.

For each model × size, one fresh process loads the captured graph and CPU profiles from $TAG_HOME
(default .tag-bench/plan, shared with plan_quality.py; captured and profiled first when missing: not
timed), draws the cluster and plans with `Budget(seconds=--budget-seconds)`. It records wall time,
simulations (set-up, MCTS; the figure `tag plan` reports), simulations per second of MCTS, peak RSS of
the process, the plan's speedup over DP-NCCL and its ratio to `ideal_time_s`.

Clusters: `random_cluster.sized_topology(seed, gpus, racks)` (racks of 64 GPUs from 512 GPUs up) when
the topology module has it, else machines of 8 GPUs of 3 catalog types in a flat cluster. Each case is
run --runs times and the median reported.

Writes benchmarks/scale.json, scale.md and scale.png.

    python benchmarks/scale.py [--models vgg19,...] [--sizes 16,128,...] [--budget-seconds 60] [--runs 3]
                               [--batch-size N]   (a global batch for every model: its own cases)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from plan_quality import bench_env, ensure_profiled  # noqa: E402  (same store and captures, same way)

MODELS = "vgg19,resnet101,transformer,bert_base"
SIZES = "16,128,512,2048,8192"
RACK_GPUS = 64  # GPUs per rack, from RACKS_FROM GPUs up
RACKS_FROM = 512


def cluster(gpus: int, seed: int):
    from tag_core.cluster import Machine, Topology, lookup_gpu

    racks = gpus // RACK_GPUS if gpus >= RACKS_FROM else None
    try:
        from tag_core.cluster.random_cluster import sized_topology
    except ImportError:  # before hierarchical topologies: flat, 8 GPUs a machine
        sized_topology = None
    if sized_topology is not None:
        return sized_topology(seed, gpus, racks)
    types = ("V100-16GB", "T4", "A100-40GB")
    machines = tuple(Machine(f"m{i}", lookup_gpu(types[i % 3]), 8, 100.0) for i in range(gpus // 8))
    return Topology(f"flat-{gpus}", machines, inter_gbps=25.0)


def one_case(model: str, gpus: int, budget_s: float, seed: int, batch_size: int | None = None) -> dict:
    """Runs in the child process. `batch_size`: the global batch (None: the model's)."""
    import resource
    import time

    from tag_core import store
    from tag_core.capture import load_op_graph
    from tag_core.plan import plan
    from tag_core.search import Budget

    conn = store.connect(read_only=True)
    graph = load_op_graph(conn, model)
    profiles = store.load_profiles(conn, model)
    conn.close()
    topology = cluster(gpus, seed)
    loaded_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    clock, cpu = time.perf_counter(), time.process_time()
    result = plan(graph, topology, profiles, batch_size=batch_size, budget=Budget(seconds=budget_s), seed=seed)
    wall, cpu = time.perf_counter() - clock, time.process_time() - cpu
    data = result.to_dict()
    mcts = result.tag
    return {
        "model": model, "gpus": topology.num_devices, "machines": topology.num_machines,
        "racks": len(getattr(topology, "racks", ()) or ()), "topology": topology.name,
        "batch_size": batch_size or graph.batch_size, "batch_given": batch_size,
        "budget_s": budget_s, "wall_s": wall, "cpu_s": cpu, "simulations": result.simulations,
        "mcts_simulations": result.evaluator.simulations, "mcts_wall_s": mcts.wall_s,
        "sims_per_s": result.evaluator.simulations / max(mcts.wall_s, 1e-9),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "loaded_rss_mib": loaded_rss,
        "speedup_vs_dp_nccl": data["speedup_vs_dp_nccl"], "time_s": result.time_s,
        "ideal_ratio": result.time_s / data["ideal_time_s"], "actions": len(result.evaluator.space.masks),
        "load_average": os.getloadavg()[0],
    }


def _key(row: dict) -> tuple:
    """A case: model, GPUs and the batch when one was given (the model's own otherwise)."""
    return row["model"], row["gpus"], row.get("batch_given")


def _median(rows: list[dict]) -> dict:
    out = dict(rows[0])
    for key in ("wall_s", "cpu_s", "simulations", "mcts_simulations", "mcts_wall_s", "sims_per_s", "peak_rss_mib",
                "speedup_vs_dp_nccl", "time_s", "ideal_ratio", "load_average"):
        values = [r[key] for r in rows if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    out["runs"] = len(rows)
    out["commit"] = ",".join(dict.fromkeys(r.get("commit") or "?" for r in rows))
    out["per_run"] = [{k: r[k] for k in ("wall_s", "cpu_s", "simulations", "peak_rss_mib", "speedup_vs_dp_nccl",
                                          "load_average") if k in r}
                      for r in rows]
    return out


def write_report(report: dict, out: Path) -> None:
    rows = report["results"]
    models = ",".join(dict.fromkeys(r["model"] for r in rows))
    sizes = ",".join(str(g) for g in sorted({r["gpus"] for r in rows}))
    runs = sorted({r.get("runs", 1) for r in rows})
    lines = ["# Planning cost against cluster size", "",
             f"`python benchmarks/scale.py --models {models} --sizes {sizes} --budget-seconds {report['budget_s']:g} "
             f"--runs {runs[-1]}` (the cases below, possibly from several invocations: re-runs replace their own "
             f"cases in scale.json) on {report['machine']}; `plan(...)` with "
             f"`Budget(seconds={report['budget_s']:g})` (set-up, MCTS, MCMC and SFB all inside it); capture and "
             f"profiling cached, not counted. Median of {'/'.join(map(str, runs))} run(s) per case (column *runs*); "
             "load average is the median over the runs of the 1-minute figure at the end of each run (the machine "
             "is shared: timings are noisy). A *batch* other than the model's own comes from `--batch-size`.", ""]
    if report.get("note"):
        lines += [report["note"], ""]
    lines += ["| model | GPUs | batch | machines | racks | wall s | simulations | MCTS sims/s | CPU s | peak RSS MiB | "
              "×DP-NCCL | TAG/ideal | masks | load | runs | commit |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        speed = f"{r['speedup_vs_dp_nccl']:.2f}" if r["speedup_vs_dp_nccl"] else "–"
        cpu = f"{r['cpu_s']:.1f}" if r.get("cpu_s") is not None else "–"
        lines.append(f"| {r['model']} | {r['gpus']} | {r.get('batch_size', '–')} | {r['machines']} | {r['racks']} | "
                     f"{r['wall_s']:.1f} | {r['simulations']:.0f} | {r['sims_per_s']:.1f} | {cpu} | "
                     f"{r['peak_rss_mib']:.0f} | {speed} | "
                     f"{r['ideal_ratio']:.2f} | {r['actions']} | {r['load_average']:.1f} | {r.get('runs', 1)} | "
                     f"{r.get('commit') or '–'} |")
    md = out.with_suffix(".md")
    kept = md.read_text().partition("\n## Analysis")[1:] if md.exists() else ("", "")
    md.write_text("\n".join(lines) + "\n" + "".join(kept))
    _plot(rows, out.with_suffix(".png"))


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = sorted((r for r in rows if r["model"] == model and not r.get("batch_given")), key=lambda r: r["gpus"])
        x = [r["gpus"] for r in mine]
        for ax, key in zip(axes, ("wall_s", "simulations", "peak_rss_mib")):
            ax.plot(x, [r[key] for r in mine], marker="o", label=model)
    for ax, title in zip(axes, ("wall time (s)", "simulations in the budget", "peak RSS (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--budget-seconds", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=None, help="global batch (default: each model's)")
    parser.add_argument("--out", default=str(HERE / "scale.json"))
    parser.add_argument("--note", default="")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "GPUS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_case(args.one[0], int(args.one[1]), args.budget_seconds, args.seed, args.batch_size)))
        return
    env = bench_env()
    # The code measured: HEAD, marked when tag_core differs from it (other sessions commit during long runs).
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "tag_core"], cwd=ROOT).returncode:
        commit += "+dirty"
    out = Path(args.out)
    previous = json.loads(out.read_text()) if out.exists() else {"results": []}
    cases = {_key(r): r for r in previous["results"]}  # re-runs replace their cases only
    for model in args.models.split(","):
        ensure_profiled(model, env)
        for gpus in (int(g) for g in args.sizes.split(",")):
            runs = []
            for _ in range(args.runs):
                batch = ["--batch-size", str(args.batch_size)] if args.batch_size else []
                done = subprocess.run([sys.executable, __file__, "--one", model, str(gpus), "--budget-seconds",
                                       str(args.budget_seconds), "--seed", str(args.seed), *batch],
                                      env=env, cwd=ROOT, capture_output=True, text=True)
                if done.returncode:
                    raise SystemExit(f"{model}/{gpus} failed:\n{done.stderr[-3000:]}")
                runs.append({**json.loads(done.stdout.strip().splitlines()[-1]), "commit": commit})
                r = runs[-1]
                print(f"{model} {gpus} GPUs: {r['wall_s']:.0f} s, {r['simulations']} sims, "
                      f"{r['peak_rss_mib']:.0f} MiB, x{r['speedup_vs_dp_nccl']}, load {r['load_average']:.1f}",
                      file=sys.stderr, flush=True)
            cases[_key(runs[0])] = _median(runs)
            report = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                      "budget_s": args.budget_seconds, "runs": args.runs, "note": args.note,
                      "args": f"--models {args.models} --sizes {args.sizes} --budget-seconds "
                              f"{args.budget_seconds:g} --runs {args.runs}",
                      "results": sorted(cases.values(), key=lambda r: (*_key(r)[:2], r.get("batch_given") or 0))}
            out.write_text(json.dumps(report, indent=1) + "\n")  # after every case: a partial run still counts
            write_report(report, out)


if __name__ == "__main__":
    main()
