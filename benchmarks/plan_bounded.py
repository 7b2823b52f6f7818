"""`tag plan MODEL --budget-seconds S` on clusters of many single-GPU machines: is the whole command bounded?

Issue 23's done-when: `tag plan mlp --budget-seconds 10` on 4096 single-GPU machines ends within
30 s, planned or refused, below 2 GiB RSS. The model is captured and profiled once first, in the
benchmark's own TAG_HOME (cached work, timed apart); then each size is planned RUNS times in a fresh
`tag` process with the default prior, as a new user would run it. Wall time is the child's from
start to exit (imports included), peak RSS its own ru_maxrss (os.wait4). Writes
benchmarks/plan_bounded.json and benchmarks/plan_bounded.md.

    python benchmarks/plan_bounded.py [--model mlp] [--sizes 1024,4096] [--budget-seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RUNS = 3


def write_topology(path: Path, n: int) -> None:
    machines = [{"name": f"m{i:04d}", "gpu": "V100-32GB", "count": 1, "intra_gbps": 300} for i in range(n)]
    path.write_text(json.dumps({"name": f"single-gpu-{n}", "machines": machines, "inter_gbps": 100}))


def run_child(command: list[str], env: dict) -> dict:
    """One `tag` process; os.wait4 gives its own peak RSS."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        return {"s": round(wall, 2), "rss_mb": round(usage.ru_maxrss / 1024, 1),
                "rc": os.waitstatus_to_exitcode(status), "stdout": out.read().decode(),
                "stderr": err.read().decode()}


def summarise(run: dict) -> dict:
    """The plan's own figures from its JSON (exit 0), else the error line."""
    if run["rc"] != 0:
        return {"error": run["stderr"].strip().splitlines()[-1][-300:] if run["stderr"].strip() else ""}
    data = json.loads(run["stdout"])
    notes = [line for line in run["stderr"].splitlines() if line.startswith("tag: warning")]
    return {"plan_wall_s": round(data["search"]["wall_s"], 2), "iterations": data["search"]["iterations"],
            "simulations": data["search"]["simulations"], "prior": data["lineage"].get("prior"),
            "iteration_ms": round(data["tag"]["iteration_time_s"] * 1e3, 3),
            "speedup_vs_dp_nccl": data["speedup_vs_dp_nccl"], "warnings": notes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--sizes", default="1024,4096", help="single-GPU machines per cluster")
    parser.add_argument("--budget-seconds", type=float, default=10.0)
    args = parser.parse_args()
    tag = [sys.executable, "-m", "tag_core.cli"]
    with tempfile.TemporaryDirectory(prefix="tag-plan-bounded-") as folder:
        folder = Path(folder)
        env = {**os.environ, "TAG_HOME": str(folder / "home"), "PYTHONPATH": str(ROOT)}
        data = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
                "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "model": args.model,
                "budget_seconds": args.budget_seconds, "runs": RUNS, "cases": []}
        prepare = run_child(tag + ["profile", args.model], env)
        if prepare["rc"] != 0:
            sys.exit(f"tag profile {args.model} failed: {prepare['stderr'][-500:]}")
        data["capture_and_profile"] = {"s": prepare["s"], "rss_mb": prepare["rss_mb"]}
        for n in [int(x) for x in args.sizes.split(",") if x]:
            path = folder / f"single-gpu-{n}.json"
            write_topology(path, n)
            command = tag + ["plan", args.model, "--topology", str(path), "--json",
                             "--budget-seconds", f"{args.budget_seconds:g}"]
            load_before = os.getloadavg()[0]
            runs = []
            for i in range(RUNS):
                print(f"{n} machines, run {i + 1}/{RUNS} ... ", end="", flush=True)
                run = run_child(command, env)
                runs.append({"s": run["s"], "rss_mb": run["rss_mb"], "rc": run["rc"], **summarise(run)})
                print(f"{run['s']} s, {run['rss_mb']} MB, exit {run['rc']}")
            times = [r["s"] for r in runs]
            data["cases"].append({"machines": n, "command": " ".join(["tag"] + command[3:]).replace(str(path),
                                                                                                     path.name),
                                  "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
                                  "peak_rss_mb": max(r["rss_mb"] for r in runs), "rc": sorted({r["rc"] for r in runs}),
                                  "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
                                  "runs": runs})
    (HERE / "plan_bounded.json").write_text(json.dumps(data, indent=1) + "\n")
    (HERE / "plan_bounded.md").write_text(report(data))
    print(f"wrote {HERE / 'plan_bounded.json'} and {HERE / 'plan_bounded.md'}")


def report(data: dict) -> str:
    lines = [
        f"# `tag plan {data['model']} --budget-seconds {data['budget_seconds']:g}` on many single-GPU machines",
        "",
        f"`benchmarks/plan_bounded.py` on {data['machine']} ({data['when']}). Each size: {data['runs']} fresh `tag` "
        "processes with the default prior; wall time from start to exit, imports included; peak RSS the "
        f"process's own. Capture and profile ran once before, apart: {data['capture_and_profile']['s']} s, "
        f"{data['capture_and_profile']['rss_mb']} MB. Issue 23's done-when: 4096 machines end within 30 s, "
        "planned or refused, below 2 GiB.",
        "",
        "| machines | median s | min-max s | peak RSS MB | exit | plan() s | MCTS iterations | simulations | prior | "
        "plan ms | vs DP-NCCL | load before/after |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for case in data["cases"]:
        first = case["runs"][0]
        speedup = first.get("speedup_vs_dp_nccl")
        lines.append(
            f"| {case['machines']:,} | {case['median_s']} | {case['min_s']}-{case['max_s']} | {case['peak_rss_mb']} | "
            f"{','.join(map(str, case['rc']))} | {first.get('plan_wall_s', '-')} | {first.get('iterations', '-')} | "
            f"{first.get('simulations', '-')} | {first.get('prior', '-')} | {first.get('iteration_ms', '-')} | "
            f"{f'{speedup:.1f}x' if speedup else '-'} | {case['load_before']}/{case['load_after']} |")
    warnings = sorted({re.sub(r"\d[\d,]*", "N", w) for c in data["cases"] for r in c["runs"]
                       for w in r.get("warnings", [])})
    if warnings:
        lines += ["", "Warnings printed (numbers as N):", ""] + [f"- `{w}`" for w in warnings]
    lines += ["", "The seconds budget bounds all of planning (`tag_core/plan/deadline.py`): set-up, then the search "
              "with the work after it held back at the set-up's measured cost per simulation, then MCMC and SFB "
              "within what is left. The GNN prior stands aside past 65,536 joint-graph edges "
              "(`tag_core/gnn/prior.py`).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
