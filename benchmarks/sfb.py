"""Sufficient Factor Broadcasting, in the shape of the TAG paper's Tables V and VI.

Two machines with one GTX1080Ti each, global batch 4, every zoo model: simulated iteration time
of DP-NCCL against DP-NCCL+SFB, and of TAG (MCTS) against TAG+SFB; the op types SFB duplicates
most often across the models (Table VI); the median and largest MILP solve time per gradient;
peak RSS. The paper does not give the link between the two machines here, so each case runs
at every `--inter-gbps` (default 10 and 100 Gbit/s).

Graphs and CPU profiles come from $TAG_HOME (default .tag-bench/plan, as benchmarks/plan_quality.py
leaves them); GTX1080Ti op times are the CPU profiles scaled by the roofline ratio (tag_core.simulate.cost).
Each model runs in its own process. Writes benchmarks/sfb.json and benchmarks/sfb.md.

    python benchmarks/sfb.py [--models vgg19,...] [--inter-gbps 10,100] [--iterations 100]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODELS = "vgg19,resnet101,inception_v3,mobilenet_v2,transformer,bert_base"
BATCH = 4


def pair(inter_gbps: float):
    from tag_core.cluster import parse_topology

    return parse_topology({"name": f"2x1080ti-{inter_gbps:g}g", "inter_gbps": inter_gbps, "machines": [
        {"name": "a", "gpu": "GTX1080Ti", "count": 1, "intra_gbps": 64},
        {"name": "b", "gpu": "GTX1080Ti", "count": 1, "intra_gbps": 64}]})


def one_model(model: str, inter: list[float], iterations: int) -> dict:
    """Runs in the child process."""
    import resource
    import time

    from tag_core import store
    from tag_core.capture import load_op_graph
    from tag_core.plan import plan
    from tag_core.search import Budget
    from tag_core.search.baselines import dp_nccl
    from tag_core.sfb import apply_sfb
    from tag_core.simulate import Simulator

    conn = store.connect(read_only=True)
    graph = load_op_graph(conn, model)
    profiles = store.load_profiles(conn, model)
    conn.close()
    cases = []
    for gbps in inter:
        topology = pair(gbps)
        sim = Simulator(graph, topology, profiles, batch_size=BATCH)
        clock = time.perf_counter()
        dp = apply_sfb(sim, dp_nccl(sim))
        dp_wall = time.perf_counter() - clock
        tag = plan(graph, topology, profiles, batch_size=BATCH, budget=Budget(iterations=iterations))
        data = tag.to_dict()
        dp_report = dp.to_dict(sim)
        solves = [d.solve_s for d in dp.decisions if d.status in ("sfb", "no_gain", "timeout")]
        cases.append({
            "inter_gbps": gbps,
            "dp_nccl_s": dp.time_without_s, "dp_nccl_sfb_s": dp.time_with_s,
            "tag_s": data["tag"]["iteration_time_s_without_sfb"], "tag_sfb_s": data["tag"]["iteration_time_s"],
            "dp_sfb": {k: dp_report[k] for k in ("considered", "by_status", "gradients")},
            "tag_sfb": {k: data["sfb"][k] for k in ("considered", "by_status", "gradients")},
            "dp_sfb_wall_s": dp_wall,
            "solve_s": solves,  # DP-NCCL's per-gradient solves
            "tag_solve_s": {"median": data["sfb"]["solve_s_median"], "max": data["sfb"]["solve_s_max"],
                            "solves": data["sfb"]["solves"]},
        })
    return {"model": model, "ops": len(graph.ops), "batch_size": BATCH, "cases": cases,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def markdown(report: dict) -> str:
    lines = [f"# SFB (Tables V and VI of the TAG paper), two GTX1080Ti machines, batch {BATCH}", "",
             f"Machine: {report['machine']}; load average at the start {report['load']}; MCTS "
             f"{report['iterations']} iterations. Simulated iteration times (ms); GTX1080Ti costs are the CPU "
             "profiles scaled by the roofline ratio. `python benchmarks/sfb.py`.", "",
             "| model | link Gbit/s | DP-NCCL | DP-NCCL+SFB | speedup | TAG | TAG+SFB | speedup | SFB gradients (DP / TAG) |"
             " peak RSS MiB |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    types: Counter = Counter()
    solves: list[float] = []
    for row in report["results"]:
        for c in row["cases"]:
            ms = {k: c[k] * 1e3 for k in ("dp_nccl_s", "dp_nccl_sfb_s", "tag_s", "tag_sfb_s")}
            lines.append(f"| {row['model']} | {c['inter_gbps']:g} | {ms['dp_nccl_s']:.2f} | {ms['dp_nccl_sfb_s']:.2f} | "
                         f"{c['dp_nccl_s'] / c['dp_nccl_sfb_s']:.2f}x | {ms['tag_s']:.2f} | {ms['tag_sfb_s']:.2f} | "
                         f"{c['tag_s'] / c['tag_sfb_s']:.2f}x | {len(c['dp_sfb']['gradients'])} / "
                         f"{len(c['tag_sfb']['gradients'])} of {c['dp_sfb']['considered']} | {row['peak_rss_mib']:.0f} |")
            for side in ("dp_sfb", "tag_sfb"):
                types.update(t for g in c[side]["gradients"] for t in g["op_types"])
            solves += c["solve_s"]
    lines += ["", "## Op types SFB duplicates (Table VI), over every model, link and plan above", "",
              "| op type | times duplicated |", "|---|---:|"]
    lines += [f"| {t} | {n} |" for t, n in types.most_common(5)]
    if solves:
        lines += ["", f"MILP solve time per gradient (DP-NCCL's decisions, {len(solves)} solves; gradients whose "
                      f"saving cannot beat a lower bound on any SFB's cost are ruled out without a solve): median "
                      f"{statistics.median(solves) * 1e3:.0f} ms, max {max(solves) * 1e3:.0f} ms."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--inter-gbps", default="10,100")
    parser.add_argument("--iterations", type=int, default=100, help="MCTS iterations per TAG plan")
    parser.add_argument("--out", default=str(HERE / "sfb.json"))
    parser.add_argument("--one", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    inter = [float(x) for x in args.inter_gbps.split(",")]
    if args.one:
        print(json.dumps(one_model(args.one, inter, args.iterations)))
        return
    env = {**os.environ, "TAG_HOME": os.environ.get("TAG_HOME", str(ROOT / ".tag-bench" / "plan")),
           "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    report = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "load": " ".join(f"{x:.1f}" for x in os.getloadavg()), "iterations": args.iterations, "results": []}
    for model in args.models.split(","):
        print(f"{model} ...", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, __file__, "--one", model, "--inter-gbps", args.inter_gbps,
                               "--iterations", str(args.iterations)], env=env, cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{model} failed:\n{done.stderr[-3000:]}")
        report["results"].append(json.loads(done.stdout.strip().splitlines()[-1]))
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")  # after every model: partial runs count
    md = HERE / "sfb.md"
    kept = md.read_text().partition("\n## Analysis")[1:] if md.exists() else ("", "")  # survives re-runs
    md.write_text(markdown(report) + "".join(kept))
    print(markdown(report))


if __name__ == "__main__":
    main()
