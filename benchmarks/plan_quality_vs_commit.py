"""Plan quality against an earlier commit's planner, both plans scored by this commit's simulator.

A planner's own figures are in its own simulator's units: when the simulator becomes more faithful (whole rows
of the batch per replica, a tensor sent once to each reader) the figures move although no plan did. Here the
earlier commit plans every case of benchmarks/plan_quality.json (same store, so the same captures and
profiles; same MCTS iterations and seed) in a child process that imports that commit's `tag_core`, saves its
plans as strategy JSON, and this commit simulates them. Today's figures are read from plan_quality.json.

Writes benchmarks/plan_quality_vs_commit.json and .md.

    python benchmarks/plan_quality_vs_commit.py [--commit f108c2f]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from plan_quality import bench_env  # noqa: E402  (the same store)

FILED = "f108c2f"  # the commit before issue 21's first change: "today" in its plan-quality bar


def plan_then(out: Path, cases: list[tuple[str, str]], iterations: int, seed: int) -> None:
    """Runs in the child, under the earlier commit's tag_core: each case's search plan and final plan."""
    from tag_core import store
    from tag_core.capture import load_op_graph
    from tag_core.cluster import load_topology
    from tag_core.plan import plan
    from tag_core.search import Budget

    for model, topology_name in cases:
        conn = store.connect(read_only=True)
        graph, profiles = load_op_graph(conn, model), store.load_profiles(conn, model)
        profile_hash = store.profile_set_hash(conn, model)
        conn.close()
        topology = load_topology(ROOT / "examples" / "topologies" / f"{topology_name}.json")
        result = plan(graph, topology, profiles, budget=Budget(iterations=iterations), seed=seed,
                      profile_hash=profile_hash)
        for kind, strategy in (("search", result.evaluator.strategy(result.tag.actions)), ("final", result.strategy)):
            (out / f"{model}_{topology_name}_{kind}.json").write_text(strategy.to_json())
        print(f"  {model} on {topology_name}: planned", file=sys.stderr, flush=True)


def score_now(folder: Path, cases: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, float]]:
    """This commit's simulated iteration time of each saved plan."""
    from tag_core import store
    from tag_core.capture import load_op_graph
    from tag_core.cluster import load_topology
    from tag_core.simulate import Simulator, Strategy

    out = {}
    for model, topology_name in cases:
        conn = store.connect(read_only=True)
        graph, profiles = load_op_graph(conn, model), store.load_profiles(conn, model)
        conn.close()
        sim = Simulator(graph, load_topology(ROOT / "examples" / "topologies" / f"{topology_name}.json"), profiles)
        out[model, topology_name] = {
            kind: float(sim.run(Strategy.from_json((folder / f"{model}_{topology_name}_{kind}.json").read_text()))
                        .iteration_time_s) for kind in ("search", "final")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default=FILED, help="the earlier commit whose planner plans")
    parser.add_argument("--now", default=str(HERE / "plan_quality.json"), help="this commit's plan_quality.json")
    parser.add_argument("--out", default=str(HERE / "plan_quality_vs_commit.json"))
    parser.add_argument("--child", nargs=2, metavar=("FOLDER", "CASES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    now = json.loads(Path(args.now).read_text())
    if args.child:
        cases = [tuple(c.split("/")) for c in args.child[1].split(",")]
        plan_then(Path(args.child[0]), cases, now["mcts_iterations"], now["seed"])
        return
    rows = {(r["model"], r["topology"]): r for r in now["results"]}
    cases = sorted(rows)
    env = bench_env()
    with tempfile.TemporaryDirectory() as tmp:
        tree, plans = Path(tmp) / "tree", Path(tmp) / "plans"
        plans.mkdir()
        subprocess.run(["git", "worktree", "add", "--detach", "-f", str(tree), args.commit], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            print(f"planning under {args.commit} ...", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, __file__, "--now", args.now, "--child", str(plans),
                            ",".join(f"{m}/{t}" for m, t in cases)],
                           env={**env, "PYTHONPATH": str(tree)}, cwd=ROOT, check=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        then = score_now(plans, cases)
    commit = subprocess.run(["git", "rev-parse", "--short", args.commit], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    report = {"then_commit": commit, "now_code_version": sorted({r["code_version"] for r in rows.values()}),
              "mcts_iterations": now["mcts_iterations"], "seed": now["seed"], "results": [
                  {"model": m, "topology": t, "dp_nccl_s": rows[m, t]["baselines_s"]["dp_nccl"],
                   "then_search_s": then[m, t]["search"], "then_final_s": then[m, t]["final"],
                   "now_search_s": rows[m, t]["tag_s"], "now_final_s": rows[m, t]["tag_sfb_s"]} for m, t in cases]}
    out = Path(args.out)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


def markdown(report: dict) -> str:
    rs = report["results"]
    ms = lambda s: f"{s * 1e3:.1f}"  # noqa: E731
    lines = [f"# Plan quality: {report['then_commit']}'s planner against today's, both scored by today's simulator",
             "", f"`python benchmarks/plan_quality_vs_commit.py --commit {report['then_commit']}`: every case of "
             f"plan_quality.json ({report['mcts_iterations']} MCTS iterations, seed {report['seed']}, the same "
             "captures and profiles), planned by that commit and simulated by today's code "
             f"({', '.join(report['now_code_version'])}). Search: the search's plan; final: after SFB. Times in ms.",
             "", "| model | topology | DP-NCCL | search then | search now | final then | final now | "
             "×DP-NCCL final then | ×DP-NCCL final now |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rs:
        dp = r["dp_nccl_s"]
        lines.append(f"| {r['model']} | {r['topology']} | {ms(dp)} | {ms(r['then_search_s'])} | "
                     f"{ms(r['now_search_s'])} | {ms(r['then_final_s'])} | {ms(r['now_final_s'])} | "
                     f"{dp / r['then_final_s']:.2f} | {dp / r['now_final_s']:.2f} |")
    median = lambda key: statistics.median(r["dp_nccl_s"] / r[key] for r in rs)  # noqa: E731
    no_worse = lambda kind: sum(r[f"now_{kind}_s"] <= r[f"then_{kind}_s"] * (1 + 1e-9) for r in rs)  # noqa: E731
    lines += ["", "## Summary", "",
              f"- median speedup over DP-NCCL, search's plan: then {median('then_search_s'):.2f}×, "
              f"now {median('now_search_s'):.2f}×; final plan: then {median('then_final_s'):.2f}×, "
              f"now {median('now_final_s'):.2f}×",
              f"- today's plan at least as fast: search {no_worse('search')} of {len(rs)}, "
              f"final {no_worse('final')} of {len(rs)}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
