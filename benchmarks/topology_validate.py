"""`tag topology validate` on topologies with a full per-pair `inter_gbps` matrix, 256 to 4096 machines.

Two kinds of matrix, one GPU per machine (4096 machines is TAG's device limit):

- rack: racks of 32 machines, 200 Gbit/s inside a rack, 100 between racks, and one degraded pair
  (37.5) per 64 machines: a realistic cluster, few distinct figures;
- distinct: every pair its own figure (10.0-400.0, one decimal): the most links a matrix can make
  (every pair but the most common figure's becomes a link; 256 to 1024 machines).

Each file is validated 3 times in a fresh `tag` process; the median wall time and the peak RSS
(the child's ru_maxrss) are recorded, with the load average around the runs. With --baseline REV,
the 256-machine files are also validated once by that revision's tag_core (extracted with git
archive), for the before/after. Files are written under a temporary folder, not the checkout.
Writes benchmarks/topology_validate.json and benchmarks/topology_validate.md.

    python benchmarks/topology_validate.py [--sizes 256,512,1024,2048,4096] [--distinct 256,512,1024]
                                           [--baseline 7b7977c]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RUNS = 3
RACK = 32


def matrix_rows(n: int, kind: str) -> list[list[float]]:
    rng = random.Random(f"topology-validate-{kind}-{n}")
    rows = [[0.0] * n for _ in range(n)]
    for i in range(n):
        row = rows[i]
        for j in range(i + 1, n):
            if kind == "rack":
                figure = 200.0 if i // RACK == j // RACK else 100.0
            else:
                figure = round(rng.uniform(10.0, 400.0), 1)
            row[j] = figure
            rows[j][i] = figure
    if kind == "rack":
        for _ in range(n // 64):
            i, j = rng.sample(range(n), 2)
            rows[i][j] = rows[j][i] = 37.5
    return rows


def write_topology(path: Path, n: int, kind: str) -> dict:
    machines = [{"name": f"m{i:04d}", "gpu": "H100-80GB", "count": 1, "intra_gbps": 900} for i in range(n)]
    rows = matrix_rows(n, kind)
    with path.open("w") as out:
        out.write('{"name": "%s-%d", "machines": %s,\n "inter_gbps": [\n' % (kind, n, json.dumps(machines)))
        out.write(",\n".join("  [" + ", ".join(f"{x:g}" for x in row) + "]" for row in rows))
        out.write("\n]}\n")
    return {"machines": n, "kind": kind, "pairs": n * (n - 1) // 2, "file_mb": round(path.stat().st_size / 1e6, 1)}


def generate(path: Path, n: int, kind: str) -> dict:
    """write_topology in a child process: this one stays small, so a child's peak RSS (which counts
    the pages it shares with its parent until it execs) is tag's own."""
    code = (f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import topology_validate as t; "
            f"print(json.dumps(t.write_topology(__import__('pathlib').Path({str(path)!r}), {n}, {kind!r})))")
    return json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def measure(path: Path, env: dict, runs: int) -> dict:
    results = []
    load_before = os.getloadavg()[0]
    for _ in range(runs):
        results.append(_child(path, env))
    times = [r["s"] for r in results]
    return {"runs": results, "median_s": round(statistics.median(times), 3), "min_s": min(times), "max_s": max(times),
            "peak_rss_mb": round(max(r["rss_kb"] for r in results) / 1024, 1),
            "rc": sorted({r["rc"] for r in results}), "summary": results[0]["summary"],
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}


def _child(path: Path, env: dict) -> dict:
    """Run one validation with os.wait4, so the peak RSS is that child's alone."""
    command = [sys.executable, "-m", "tag_core.cli", "topology", "validate", str(path)]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=env["TAG_BENCH_CWD"])
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        lines = out.read().decode().splitlines()
        summary = lines[1] if proc.returncode == 0 and len(lines) > 1 else err.read().decode().strip()[-300:]
    return {"s": round(wall, 3), "rss_kb": usage.ru_maxrss, "rc": proc.returncode, "summary": summary}


def baseline_tree(revision: str, folder: Path) -> Path:
    """That revision's tag_core, extracted (git archive) into `folder`: the code as it was."""
    archive = folder / "baseline.tar"
    subprocess.run(["git", "archive", "-o", str(archive), revision, "tag_core"], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(folder / "baseline", filter="data")
    return folder / "baseline"


def report(data: dict) -> str:
    lines = [
        "# `tag topology validate` on a per-pair matrix",
        "",
        f"`benchmarks/topology_validate.py` on {data['machine']} ({data['when']}); each figure is the median of "
        f"{RUNS} fresh `tag` processes, peak RSS the largest child's. The machine is shared: the load average "
        "(1 min) before and after each file is noted. Issue 23's done-when: a 4096-machine matrix validates in "
        "at most 5 s.",
        "",
        "| matrix | machines | file MB | pairs | links | median s | min-max s | peak RSS MB | load | exit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in data["cases"]:
        m = case["result"]
        lines.append(f"| {case['kind']} | {case['machines']:,} | {case['file_mb']} | {case['pairs']:,} | "
                     f"{case['links']:,} | {m['median_s']} | {m['min_s']}-{m['max_s']} | {m['peak_rss_mb']} | "
                     f"{m['load_before']}/{m['load_after']} | {','.join(map(str, m['rc']))} |")
    if data.get("baseline"):
        lines += ["", f"Before (`{data['baseline']['revision']}`, one run each, the quadratic most-common-figure "
                      "search and json for every number):", "",
                  "| matrix | machines | s | peak RSS MB | exit |", "|---|---:|---:|---:|---:|"]
        for case in data["baseline"]["cases"]:
            lines.append(f"| {case['kind']} | {case['machines']:,} | {case['s']} | {round(case['rss_kb'] / 1024, 1)} | "
                         f"{case['rc']} |")
    lines += ["", "A plain numeric matrix is cut out of the file and read with numpy (`tag_core/cluster/pair_matrix.py`);"
              " the rest of the file, and any matrix the fast reader declines, go through json. The distinct"
              " matrices cost more because every pair but the most common figure's becomes a link of the topology"
              " (its hash and summary are over links).", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,512,1024,2048,4096", help="machines of the rack matrices")
    parser.add_argument("--distinct", default="256,512,1024", help="machines of the distinct matrices ('' for none)")
    parser.add_argument("--baseline", help="a git revision to validate the 256-machine files with, once")
    args = parser.parse_args()
    cases = [(int(n), "rack") for n in args.sizes.split(",") if n]
    cases += [(int(n), "distinct") for n in args.distinct.split(",") if n]
    with tempfile.TemporaryDirectory(prefix="tag-topology-bench-") as folder:
        folder = Path(folder)
        env = {**os.environ, "TAG_HOME": str(folder / "tag_home"), "TAG_BENCH_CWD": str(ROOT),
               "PYTHONPATH": str(ROOT)}
        data = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
                "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": RUNS, "cases": []}
        files = {}
        for n, kind in cases:
            path = folder / f"{kind}-{n}.json"
            info = generate(path, n, kind)
            files[(n, kind)] = path
            print(f"{kind} {n}: {info['file_mb']} MB ... ", end="", flush=True)
            info["result"] = measure(path, env, RUNS)
            summary = info["result"]["summary"]
            info["links"] = _links(path) if info["result"]["rc"] == [0] else None
            info["parent_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
            print(f"median {info['result']['median_s']} s, peak RSS {info['result']['peak_rss_mb']} MB ({summary})")
            data["cases"].append(info)
        if args.baseline:
            tree = baseline_tree(args.baseline, folder)
            old_env = {**env, "PYTHONPATH": str(tree), "TAG_BENCH_CWD": str(tree)}
            data["baseline"] = {"revision": args.baseline, "cases": []}
            for (n, kind), path in files.items():
                if n != 256:
                    continue
                print(f"baseline {args.baseline} {kind} {n} ... ", end="", flush=True)
                one = _child(path, old_env)
                print(f"{one['s']} s")
                data["baseline"]["cases"].append({"machines": n, "kind": kind, **one})
    (HERE / "topology_validate.json").write_text(json.dumps(data, indent=1) + "\n")
    (HERE / "topology_validate.md").write_text(report(data))
    print(f"wrote {HERE / 'topology_validate.json'} and {HERE / 'topology_validate.md'}")


def _links(path: Path) -> int:
    """How many links the validated topology has (in a child: not part of the timing, and this process
    stays small)."""
    code = ("import sys; from tag_core.cluster import load_topology; "
            f"print(len(load_topology({str(path)!r}).links))")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              cwd=ROOT).stdout)


if __name__ == "__main__":
    main()
