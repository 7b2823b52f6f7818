"""`make demo` after install: wall time, peak RSS and where the time goes.

Each run is `python -m tag_pipelines.demo` (what `make demo` runs once installed) in a fresh process with a
fresh TAG_HOME, DAGSTER_HOME, topology directory and model registry, so nothing is cached between runs.
Configurations: the default (2 partitions at once; RUNS runs, median reported), one partition at a time
(`--workers 1`), and, for one model on one topology, each run's executor in-process against multiprocess.
Wall time is the child's from start to exit (imports included); peak RSS the largest process of its tree
(ru_maxrss of the waited children). Per-stage seconds are summed from the demo's own progress lines.
Writes benchmarks/demo.json and benchmarks/demo.md.

    python benchmarks/demo.py [--runs 2] [--skip-serial] [--skip-executors]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DONE = re.compile(r"^\s*(\d+) s\s+done\s+(\S+) \[(.*)\] in ([\d.]+) s")


def run_demo(args: list[str]) -> dict:
    """One demo process in fresh homes: wall seconds, peak RSS, stage seconds, exit code."""
    with tempfile.TemporaryDirectory(prefix="tag-demo-bench-") as home:
        env = {**os.environ, "TAG_HOME": f"{home}/tag", "DAGSTER_HOME": f"{home}/dagster",
               "TAG_TOPOLOGY_DIR": f"{home}/topologies", "TAG_MODELS_FILE": f"{home}/models.yaml",
               "TAG_CALIBRATION_DIR": f"{home}/calibrations"}
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "tag_pipelines.demo", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True)
        wall = time.perf_counter() - started
    stages: dict[str, float] = defaultdict(float)
    for line in done.stdout.splitlines():
        if match := DONE.match(line):
            stages[match[2]] += float(match[4])
    top = ", ".join(f"{k} {v:.0f}" for k, v in sorted(stages.items(), key=lambda kv: -kv[1]))
    print(f"  {' '.join(args) or '(default)'}: {wall:.0f} s, exit {done.returncode}; stage s: {top}", flush=True)
    first = next((int(m[1]) for line in done.stdout.splitlines() if (m := re.match(r"^\s*(\d+) s\s+start", line))), None)
    print(f"    first stage started at {first} s; last lines: {done.stdout.splitlines()[-1:]}", flush=True)
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
    return {"args": args, "wall_s": round(wall, 1), "exit": done.returncode, "first_stage_s": first,
            "stage_s": {k: round(v, 1) for k, v in sorted(stages.items(), key=lambda kv: -kv[1])},
            "tail": done.stdout.splitlines()[-12:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--skip-serial", action="store_true")
    parser.add_argument("--skip-executors", action="store_true")
    parser.add_argument("--key", default="parallel", help="where the default runs go in demo.json (kept: the rest)")
    args = parser.parse_args()
    one = ["--models", "mlp", "--topologies", str(ROOT / "examples" / "topologies" / "testbed.json"), "--workers", "1"]
    out = HERE / "demo.json"
    results: dict = json.loads(out.read_text()) if out.exists() and args.key != "parallel" else {}
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_at_start": os.getloadavg()[0]}
    print("default (2 partitions at once):" if args.runs else "", flush=True)
    if args.runs:  # --runs 0 keeps the recorded default runs (to add the one-at-a-time run alone)
        results[args.key] = [run_demo([]) for _ in range(args.runs)]
    if not args.skip_serial:
        print("one partition at a time:", flush=True)
        results["serial" if args.key == "parallel" else f"{args.key}_serial"] = [run_demo(["--workers", "1"])]
    if not args.skip_executors:
        print("executors, mlp on testbed:", flush=True)
        results["executors"] = {name: run_demo([*one, "--executor", name]) for name in ("in_process", "multiprocess")}
    peak = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    results["peak_rss_mb"] = max(peak, results.get("peak_rss_mb", 0))
    results["machine"]["load_at_end"] = os.getloadavg()[0]
    out.write_text(json.dumps(results, indent=1) + "\n")
    (HERE / "demo.md").write_text(markdown(results))
    print(markdown(results))
    return 0


def markdown(results: dict) -> str:
    def median(runs: list[dict]) -> float:
        return statistics.median(r["wall_s"] for r in runs)

    machine = results["machine"]
    lines = ["# `make demo` after install", "",
             f"`python benchmarks/demo.py` on {machine['cpus']} CPUs shared with other jobs (load average "
             f"{machine['load_at_start']:.1f} at the start, {machine['load_at_end']:.1f} at the end). Each run: "
             "`python -m tag_pipelines.demo` in fresh homes (3 models × 2 topologies, 11 runs).", "",
             "| configuration | runs | wall s (median) | each run |", "|---|---:|---:|---|"]
    for name, label in (("final", "`make demo` as shipped: 2 partitions at once, fusion untuned"),
                        ("final_serial", "the same, `--workers 1`: one partition at a time"),
                        ("parallel", "2 partitions at once, fusion tuned (the demo before it stopped tuning)"),
                        ("serial", "`--workers 1`: one partition at a time, fusion tuned")):
        if name in results:
            runs = results[name]
            each = ", ".join(f"{r['wall_s']:.0f}" for r in runs)
            lines.append(f"| {label} | {len(runs)} | {median(runs):.0f} | {each} |")
    for name, run in results.get("executors", {}).items():
        lines.append(f"| mlp on testbed, one partition at a time, `--executor {name}`, fusion untuned | 1 | "
                     f"{run['wall_s']:.0f} | |")
    lines += ["", f"Largest process: {results.get('peak_rss_mb', '?')} MB peak RSS (the most of every run recorded here).",
              "", "The load averages above are the last invocation's. The rows of `make demo` as shipped ran last "
              "(`--key final`, then `--runs 0 --key final` for the one-at-a-time row); the fusion-tuned and executor "
              "rows ran on older code under load averages of 2.5 to 7 from other jobs, so they compare with each "
              "other only.", "",
              "Where the time goes (default configuration, first run; seconds summed over partitions, so two "
              "partitions running at once both count):", "", "| stage | s |", "|---|---:|"]
    lines += [f"| `{stage}` | {s:.0f} |" for stage, s in results["parallel"][0]["stage_s"].items()]
    if "final" in results:
        lines += ["", "The same for `make demo` as shipped (first run):", "", "| stage | s |", "|---|---:|"]
        lines += [f"| `{stage}` | {s:.0f} |" for stage, s in results["final"][0]["stage_s"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
