"""Plan quality: TAG (MCTS) against DP-NCCL, DP-NCCL-P, Horovod and FlexFlow-style MCMC.

For each zoo model × topology (examples/topologies/{testbed,cloud}.json), one fresh process
loads the captured graph and CPU profiles from $TAG_HOME (default .tag-bench/plan), runs
`tag_core.plan.planner.plan` (MCTS with --iterations, then MCMC with as many simulations as MCTS
used), and then MCMC again with ten times that many simulations from the same start.
Models without a capture or profiles are captured and profiled first (`tag capture`,
`tag profile --batch-sizes 2,4 --runs 3`, each in its own process; bert_base and vgg19
steps take seconds each on this CPU).

Writes benchmarks/plan_quality.json and benchmarks/plan_quality.md.

    python benchmarks/plan_quality.py [--models vgg19,...] [--topologies testbed,cloud] [--iterations 150]
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
TAG = str(Path(sys.executable).parent / "tag")
MODELS = "vgg19,resnet101,inception_v3,mobilenet_v2,transformer,bert_base"


def one_case(model: str, topology_name: str, iterations: int, seed: int) -> dict:
    """Runs in the child process: plan, MCMC at 10x, peak RSS."""
    import resource
    import time

    from tag_core import store
    from tag_core.capture import load_op_graph
    from tag_core.cluster import load_topology
    from tag_core.plan import plan
    from tag_core.search import Budget, Evaluator, mcmc_search

    conn = store.connect(read_only=True)
    graph = load_op_graph(conn, model)
    profiles = store.load_profiles(conn, model)
    profile_hash = store.profile_set_hash(conn, model)
    conn.close()
    topology = load_topology(ROOT / "examples" / "topologies" / f"{topology_name}.json")
    result = plan(graph, topology, profiles, budget=Budget(iterations=iterations), seed=seed, profile_hash=profile_hash)
    data = result.to_dict()
    ev = result.evaluator
    mcts_sims = ev.simulations  # MCTS's own (the equal-budget MCMC got exactly these)
    clock = time.perf_counter()
    ten = mcmc_search(Evaluator(ev.sim, ev.groups, ev.space, ev.shares, ev.fusion_bytes, ev.overlap, speed=ev.speed),
                      result.start, Budget(simulations=10 * mcts_sims), data["baselines"]["dp_nccl"]["iteration_time_s"],
                      seed=seed)
    ten_wall = time.perf_counter() - clock
    reach = next((s for _, s, t in result.tag.trace if t <= ten.time_s * (1 + 1e-9)), None)
    return {
        "model": model, "topology": topology_name, "code_version": data["lineage"]["code_version"],
        "ops": len(graph.ops), "devices": topology.num_devices,
        "batch_size": data["batch_size"], "groups": data["groups"],
        "baselines_s": {k: v["iteration_time_s"] for k, v in data["baselines"].items()},
        "baselines_oom": {k: v["oom"] for k, v in data["baselines"].items()},
        # The search's own plan (MCMC gets no SFB either), and the plan after SFB.
        "tag_s": data["tag"]["iteration_time_s_without_sfb"], "tag_sfb_s": data["tag"]["iteration_time_s"],
        "oom": data["oom"], "ideal_s": data["ideal_time_s"],
        "settings": data["tag"]["settings"], "actions": _count(result.actions),
        "search": data["search"], "mcts_simulations": mcts_sims,
        "mcts_trace": [list(x) for x in result.tag.trace],
        "mcmc_equal": {"simulations": result.mcmc.simulations, "time_s": result.mcmc.time_s,
                       "proposals": result.mcmc.iterations},
        "mcmc_10x": {"simulations": ten.simulations, "time_s": ten.time_s, "proposals": ten.iterations,
                     "wall_s": ten_wall, "trace": [list(x) for x in ten.trace]},
        "mcts_simulations_to_reach_mcmc_10x": reach,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _count(actions: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in actions:
        out[a] = out.get(a, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def bench_env() -> dict:
    """The planning children's environment: one BLAS thread, the benchmark store unless TAG_HOME names one."""
    return {**os.environ, "TAG_HOME": os.environ.get("TAG_HOME", str(ROOT / ".tag-bench" / "plan")),
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}


def ensure_profiled(model: str, env: dict) -> None:
    code = ("import sys;from tag_core import store;c=store.connect();"
            "sys.exit(0 if store.captured_model(c, sys.argv[1]) is not None and "
            "not store.load_profiles(c, sys.argv[1]).empty else 1)")
    if subprocess.run([sys.executable, "-c", code, model], env=env, cwd=ROOT, capture_output=True).returncode == 0:
        return
    for command in ([TAG, "capture", model], [TAG, "profile", model, "--batch-sizes", "2,4", "--runs", "3",
                                              "--warmup", "1"]):
        print(f"  {' '.join(command[1:])} ...", file=sys.stderr, flush=True)
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--topologies", default="testbed,cloud")
    parser.add_argument("--iterations", type=int, default=150, help="MCTS iterations per case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(HERE / "plan_quality.json"))
    parser.add_argument("--note", default="", help="a line for the markdown (e.g. what was left out and why)")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "TOPOLOGY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_case(args.one[0], args.one[1], args.iterations, args.seed)))
        return
    env = bench_env()
    out = Path(args.out)
    previous = json.loads(out.read_text()) if out.exists() else {"results": []}
    rows = {(r["model"], r["topology"]): r for r in previous["results"]}  # re-runs replace their cases only
    for model in args.models.split(","):
        ensure_profiled(model, env)
        for topology in args.topologies.split(","):
            print(f"{model} on {topology} ...", file=sys.stderr, flush=True)
            done = subprocess.run([sys.executable, __file__, "--one", model, topology, "--iterations",
                                   str(args.iterations), "--seed", str(args.seed)],
                                  env=env, cwd=ROOT, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{model}/{topology} failed:\n{done.stderr[-3000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            rows[(model, topology)] = row
            print(f"  TAG {row['tag_s'] * 1e3:.1f} ms, DP-NCCL {row['baselines_s']['dp_nccl'] * 1e3:.1f} ms, "
                  f"MCMC10x {row['mcmc_10x']['time_s'] * 1e3:.1f} ms, {row['search']['wall_s']:.0f} s, "
                  f"{row['peak_rss_mib']:.0f} MiB", file=sys.stderr, flush=True)
            report = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                      "mcts_iterations": args.iterations, "seed": args.seed, "note": args.note,
                      "results": sorted(rows.values(), key=lambda r: (r["model"], r["topology"]))}
            out.write_text(json.dumps(report, indent=1) + "\n")  # after every case: a partial run still counts
    md = out.with_suffix(".md")  # beside the JSON: a run with --out elsewhere leaves the committed tables alone
    # The hand-written analysis at the end of the markdown survives a re-run.
    kept = md.read_text().partition("\n## Analysis")[1:] if md.exists() else ("", "")
    md.write_text(markdown(report) + "".join(kept))
    print(markdown(report))


def markdown(report: dict) -> str:
    rs = report["results"]
    ms = lambda s: f"{s * 1e3:.1f}"  # noqa: E731
    lines = ["# Plan quality: TAG (MCTS) against the baselines", "",
             f"`python benchmarks/plan_quality.py --iterations {report['mcts_iterations']}` on {report['machine']}; "
             "CPU profiles (batch 2 and 4) scaled to each GPU type by the cost model's roofline ratio; "
             "each model at its zoo batch size. Times are simulated iteration times in ms.", ""]
    if report.get("note"):
        lines += [report["note"], ""]
    lines += ["TAG is the search's plan; TAG+SFB adds Sufficient Factor Broadcasting after it (benchmarks/sfb.md).", "",
              "| model | topology | DP-NCCL | DP-NCCL-P | Horovod | MCMC | TAG | TAG+SFB | ×DP-NCCL | ×DP-NCCL-P | "
              "×Horovod | ×MCMC | TAG/ideal | simulations | peak RSS MiB |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rs:
        b, t = r["baselines_s"], r["tag_s"]
        oom = lambda k: " (OOM)" if r["baselines_oom"].get(k) else ""  # noqa: E731
        lines.append(f"| {r['model']} | {r['topology']} | {ms(b['dp_nccl'])}{oom('dp_nccl')} | "
                     f"{ms(b['dp_nccl_p'])}{oom('dp_nccl_p')} | {ms(b['horovod'])}{oom('horovod')} | {ms(b['mcmc'])} | "
                     f"{ms(t)} | {ms(r.get('tag_sfb_s', t))} | {b['dp_nccl'] / t:.2f} | {b['dp_nccl_p'] / t:.2f} | {b['horovod'] / t:.2f} | "
                     f"{b['mcmc'] / t:.2f} | {t / r['ideal_s']:.2f} | {r['search']['simulations']} | "
                     f"{r['peak_rss_mib']:.0f} |")
    lines += ["", "## MCTS against MCMC", "",
              "| model | topology | MCTS sims | MCTS | MCMC, same sims | MCMC, 10× sims | MCTS sims to reach MCMC 10× | "
              "MCTS ≤ MCMC 10× |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rs:
        reach = r["mcts_simulations_to_reach_mcmc_10x"]
        lines.append(f"| {r['model']} | {r['topology']} | {r['mcts_simulations']} | {ms(r['tag_s'])} | "
                     f"{ms(r['mcmc_equal']['time_s'])} | {ms(r['mcmc_10x']['time_s'])} | {reach if reach else '–'} | "
                     f"{'yes' if reach else 'no'} |")
    if rs:
        def against_baselines(key: str) -> str:
            best = [min(v for k, v in r["baselines_s"].items() if k != "mcmc") / r.get(key, r["tag_s"]) for r in rs]
            return (f"{statistics.median(r['baselines_s']['dp_nccl'] / r.get(key, r['tag_s']) for r in rs):.2f}×, "
                    f"over the best of DP-NCCL/DP-NCCL-P/Horovod: {statistics.median(best):.2f}× "
                    f"(worst case {min(best):.2f}×)")

        lines += ["", "## Summary", "",
                  f"- median speedup over DP-NCCL, the search's plan (TAG): {against_baselines('tag_s')}",
                  f"- the plan `tag plan` returns (TAG+SFB): {against_baselines('tag_sfb_s')}",
                  f"- median TAG/ideal: {statistics.median(r['tag_s'] / r['ideal_s'] for r in rs):.2f}",
                  f"- MCTS at or below MCMC with 10× the simulations: "
                  f"{sum(1 for r in rs if r['mcts_simulations_to_reach_mcmc_10x'])} of {len(rs)} cases",
                  f"- median search wall time {statistics.median(r['search']['wall_s'] for r in rs):.1f} s "
                  f"(MCTS and equal-budget MCMC); peak RSS max {max(r['peak_rss_mib'] for r in rs):.0f} MiB"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
