"""Whether `tag fuse --tune --measure` keeps the same plan from run to run on one model.

Each run is a fresh `tag fuse` process on its own empty TAG_HOME. A plan is named by a digest of what it
applies: its patterns and its regions, each as a sorted set of op names. The runs' digests, what the step
check measured of each variant, the four modes' step times, and each run's wall time and peak RSS go to
benchmarks/fuse_stability.json and .md.

    python benchmarks/fuse_stability.py [--runs 3] [--model 'transformer[layers=1,...]']
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL = "transformer[layers=1,d_model=64,heads=2,ff=128,vocab=500,seq_len=16,batch_size=8]"


def plan_digest(plan: dict) -> str:
    """What the plan applies, independent of the order tuning found it in."""
    applied = [sorted(sorted(p) for p in plan["patterns"]), sorted(sorted(r) for r in plan.get("regions", []))]
    return hashlib.sha256(json.dumps(applied).encode()).hexdigest()[:12]


def fuse_once(model: str, timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="tag-fuse-stability-") as home, \
            tempfile.NamedTemporaryFile(suffix=".rss") as rss:
        env = {**os.environ, "TAG_HOME": home}
        started = time.monotonic()
        done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name, sys.executable, "-m", "tag_core.cli",
                               "fuse", model, "--tune", "--measure", "--json"], cwd=ROOT, env=env,
                              capture_output=True, text=True, check=True, timeout=timeout_s)
        wall_s = time.monotonic() - started
        peak_kib = int(Path(rss.name).read_text().split()[-1])
    plan = json.loads(done.stdout)
    measured = plan["measured"]
    check = measured.get("step_check", {})
    return {"digest": plan_digest(plan), "patterns": len(plan["patterns"]), "regions": len(plan.get("regions", [])),
            "region_ops": sum(map(len, plan.get("regions", []))), "kernels": [plan["kernels_before"],
                                                                             plan["kernels_after"]],
            "tuned_patterns_kept": measured.get("tuned_patterns_kept"),
            "patterns_inside_regions": measured.get("patterns_inside_regions", 0),
            "variants": check.get("variants", []), "step_ms": measured.get("step_ms", {}),
            "wall_s": round(wall_s, 1), "peak_rss_mib": round(peak_kib / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")
    args = parser.parse_args()
    runs = []
    for k in range(args.runs):
        runs.append(fuse_once(args.model, args.timeout))
        print(f"run {k + 1}: plan {runs[-1]['digest']}, {runs[-1]['patterns']} patterns, {runs[-1]['regions']} "
              f"region(s) of {runs[-1]['region_ops']} ops, {runs[-1]['wall_s']} s", file=sys.stderr)
    result = {"model": args.model, "machine": platform.node(), "cpus": os.cpu_count(), "runs": runs,
              "same_plan_every_run": len({r["digest"] for r in runs}) == 1,
              "median_wall_s": statistics.median(r["wall_s"] for r in runs),
              "max_peak_rss_mib": max(r["peak_rss_mib"] for r in runs)}
    (HERE / "fuse_stability.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# `tag fuse --tune --measure` run {args.runs} times on {args.model}", "",
             f"Same plan every run: **{result['same_plan_every_run']}**; median wall {result['median_wall_s']} s, "
             f"peak RSS {result['max_peak_rss_mib']} MiB.", "",
             "| run | plan | patterns | regions (ops) | tuned patterns kept (inside regions) | step check ratios | "
             "tf / tag / jit ms | wall s | peak RSS MiB |", "|---|---|---|---|---|---|---|---|---|"]
    for k, r in enumerate(runs, 1):
        ratios = ", ".join(f"{v.get('patterns')}p{v.get('regions')}r {v.get('ratio', 'failed')}" for v in r["variants"])
        ms = r["step_ms"]
        modes = " / ".join(f"{ms[m]:.2f}" if m in ms else "-" for m in ("tf", "tag", "jit"))
        lines.append(f"| {k} | {r['digest']} | {r['patterns']} | {r['regions']} ({r['region_ops']}) | "
                     f"{r['tuned_patterns_kept']} ({r['patterns_inside_regions']}) | {ratios} | {modes} | "
                     f"{r['wall_s']} | {r['peak_rss_mib']} |")
    (HERE / "fuse_stability.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
