"""The first `tag plan` after an install, with and without `make install`'s kernel warm-up
(tag_core.plan.warm_kernels): how many MCTS iterations a time budget buys when the simulator's numba kernels
must first compile, and when their cache is already there.

Each round plans one model on one topology in a fresh `tag plan` process twice: with an empty numba cache
(cold, as before the warm-up), and with a cache that only `python -m tag_core.plan.warm_kernels` filled
(warmed). Medians over the rounds go to benchmarks/kernel_warmup.json and .md, with each plan's peak RSS.

    python benchmarks/kernel_warmup.py [--rounds 3] [--budget-seconds 10] [--model mlp]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TAG = [sys.executable, "-m", "tag_core.cli"]


def plan_once(env: dict, model: str, topology: str, budget_s: float) -> dict:
    """One `tag plan` process: its iterations and peak RSS (from /usr/bin/time)."""
    with tempfile.NamedTemporaryFile(suffix=".rss") as rss:
        done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name, *TAG, "plan", model, "--topology",
                               topology, "--budget-seconds", str(budget_s), "--json"], cwd=ROOT, env=env,
                              capture_output=True, text=True, check=True)
        peak_kib = int(Path(rss.name).read_text().split()[-1])
    return {"iterations": json.loads(done.stdout)["search"]["iterations"], "peak_rss_mib": round(peak_kib / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget-seconds", type=float, default=10.0)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--topology", default=str(ROOT / "examples" / "topologies" / "cloud.json"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tag-warmup-") as work:
        env = {**os.environ, "TAG_HOME": str(Path(work) / "home")}
        subprocess.run([*TAG, "plan", args.model, "--topology", args.topology, "--budget-iterations", "1"],
                       cwd=ROOT, env=env, capture_output=True, check=True)  # capture and profile, untimed
        for r in range(args.rounds):
            for state in ("cold", "warmed"):
                cache = Path(work) / f"numba-{state}-{r}"
                env["NUMBA_CACHE_DIR"] = str(cache)
                if state == "warmed":
                    subprocess.run([sys.executable, "-m", "tag_core.plan.warm_kernels"], cwd=ROOT, env=env, check=True,
                                   capture_output=True)
                row = {"round": r, "state": state, **plan_once(env, args.model, args.topology, args.budget_seconds)}
                print(row, flush=True)
                rows.append(row)
    summary = {state: {"median_iterations": statistics.median(r["iterations"] for r in rows if r["state"] == state),
                       "peak_rss_mib": max(r["peak_rss_mib"] for r in rows if r["state"] == state)}
               for state in ("cold", "warmed")}
    report = {"model": args.model, "topology": Path(args.topology).stem, "budget_seconds": args.budget_seconds,
              "machine": f"{platform.machine()}, {os.cpu_count()} cores", "rows": rows, "summary": summary,
              "ratio": summary["warmed"]["median_iterations"] / max(summary["cold"]["median_iterations"], 1)}
    (HERE / "kernel_warmup.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [f"# The first plan after an install: {args.model} on {report['topology']}, "
             f"{args.budget_seconds:g} s budget", "", f"Machine: {report['machine']}; {args.rounds} rounds.", "",
             "| numba cache | median iterations | peak RSS (MiB) |", "| --- | --- | --- |"]
    lines += [f"| {state} | {s['median_iterations']:g} | {s['peak_rss_mib']} |" for state, s in summary.items()]
    lines += ["", f"Warmed / cold: {report['ratio']:.1f}x the iterations in the same budget.", ""]
    (HERE / "kernel_warmup.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
