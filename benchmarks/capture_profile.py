"""How long capture and profiling take here, per zoo model, and their peak memory.

Per model: `tag capture MODEL` then `tag profile MODEL --batch-sizes ... --runs ...`, each a process of its own
whose process tree (the `tag` process and every child it starts) is sampled from /proc every 50 ms:

- parent peak: the `tag` process's own high-water mark (VmHWM);
- largest child peak: the largest VmHWM of any process it started (capture child, tracing child, profiler);
- tree peak: the largest sum of the current RSS of all of them at one sample, what the machine must hold.

Writes benchmarks/capture_profile.json and benchmarks/capture_profile.md. The profiles stay in $TAG_HOME
(default .tag-bench) for the other benchmarks.

    python benchmarks/capture_profile.py [--models vgg19,...] [--batch-sizes 2,4] [--runs 5] [--root DIR]
        [--out STEM] [--before OLD.json] [--render RUN.json]

`--root` runs another checkout's tag_core (a baseline, e.g. `git archive` of an older commit); `--out` names
the output files' stem; `--before` adds a before/after table from an earlier run's .json; `--render` writes
the files again from a run's .json without measuring. An existing `--out` .json is merged into: the models
measured now replace their rows, the others keep theirs (each row names its commit), and its notes stay
(`--fresh` starts from nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIB = 2**20
BUDGET_MIB = 4096  # issue 21: capture and profile of every zoo model within 4 GiB
MODELS = "vgg19,resnet101,inception_v3,mobilenet_v2,transformer,bert_base,mlp,small_cnn"


def _status(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of `pid` in bytes; (0, 0) once it is gone."""
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return rss, hwm


def _descendants(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        current = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{current}/task/{task}/children").read_text().split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            for child in map(int, children):
                found.append(child)
                stack.append(child)
    return found


def run_sampled(command: list[str], env: dict, cwd: str | None = None, every_s: float = 0.05) -> dict:
    """Run `command`, sampling its process tree; its wall time, output and peaks (module docstring) in MiB."""
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    parent_peak, child_peaks, tree_peak = 0, {}, 0
    import threading

    out: dict[str, str] = {}
    readers = [threading.Thread(target=lambda name=name, stream=stream: out.__setitem__(name, stream.read()))
               for name, stream in (("stdout", process.stdout), ("stderr", process.stderr))]
    for reader in readers:
        reader.start()
    while process.poll() is None:
        rss, hwm = _status(process.pid)
        parent_peak, tree = max(parent_peak, hwm), rss
        for child in _descendants(process.pid):
            child_rss, child_hwm = _status(child)
            child_peaks[child] = max(child_peaks.get(child, 0), child_hwm)
            tree += child_rss
        tree_peak = max(tree_peak, tree)
        time.sleep(every_s)
    wall = time.perf_counter() - start
    for reader in readers:
        reader.join()
    return {"returncode": process.returncode, "wall_s": wall, "stdout": out.get("stdout", ""),
            "stderr": out.get("stderr", ""), "parent_peak_mib": parent_peak / MIB,
            "child_peak_mib": max(child_peaks.values(), default=0) / MIB, "children": len(child_peaks),
            "tree_peak_mib": tree_peak / MIB}


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--batch-sizes", default="2,4")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--root", help="checkout whose tag_core runs (default: this one)")
    parser.add_argument("--out", default=str(HERE / "capture_profile"), help="output stem (.json and .md)")
    parser.add_argument("--before", help="an earlier run's .json (e.g. of --root at an older commit) to compare with")
    parser.add_argument("--render", help="write the .md (and .json) again from this run's .json, measuring nothing")
    parser.add_argument("--fresh", action="store_true", help="write only this run's rows (default: merge into --out)")
    args = parser.parse_args()
    if args.render:
        report = json.loads(Path(args.render).read_text())
        args.batch_sizes, args.runs = report["profile_batch_sizes"], report["runs"]
        write(args, report["commit"], report["results"],
              {k: report[k] for k in ("not_measured", "notes") if k in report})
        return
    root = Path(args.root).resolve() if args.root else HERE.parent
    env = {**os.environ, "TAG_HOME": os.environ.get("TAG_HOME", str(HERE.parent / ".tag-bench")),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    tag = [sys.executable, "-m", "tag_core.cli"]
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    kept, extra = _earlier(Path(args.out).with_suffix(".json"), args) if not args.fresh else ([], {})
    measured = args.models.split(",")
    kept = [r for r in kept if r["model"] not in measured]
    extra["not_measured"] = [m for m in extra.get("not_measured", []) if m not in measured]
    results = []
    for model in measured:
        print(f"{model} ... (load {_load()})", file=sys.stderr, flush=True)
        load_before = _load()
        captured = run_sampled([*tag, "capture", model, "--json"], env, cwd=str(root))
        if captured["returncode"] != 0:
            raise SystemExit(f"{model}: capture failed:\n{captured['stderr'][-3000:]}")
        profiled = run_sampled([*tag, "profile", model, "--batch-sizes", args.batch_sizes, "--runs", str(args.runs)],
                               env, cwd=str(root))
        if profiled["returncode"] != 0:
            raise SystemExit(f"{model}: profile failed:\n{profiled['stderr'][-3000:]}")
        summary = json.loads(captured["stdout"])
        row = {"model": model, "batch_size": summary["batch_size"], "ops": summary["ops"],
               "parameters": summary["parameters"], "load_before": load_before, "load_after": _load(),
               "commit": commit}
        for phase, measured in (("capture", captured), ("profile", profiled)):
            row.update({f"{phase}_s": measured["wall_s"], f"{phase}_parent_mib": measured["parent_peak_mib"],
                        f"{phase}_child_mib": measured["child_peak_mib"], f"{phase}_tree_mib": measured["tree_peak_mib"],
                        f"{phase}_children": measured["children"]})
        row["peak_mib"] = max(row["capture_tree_mib"], row["profile_tree_mib"])
        results.append(row)
        print(f"  {row}", file=sys.stderr, flush=True)
        # After each model: a long run that stops keeps what it measured.
        write(args, commit, _in_order(results + kept), extra)


def _earlier(path: Path, args) -> tuple[list[dict], dict]:
    """The rows and notes of an earlier run written to `path` with the same profile settings, each row
    naming the commit it was measured at; ([], {}) when there is none."""
    if not path.exists():
        return [], {}
    report = json.loads(path.read_text())
    if (report["profile_batch_sizes"], report["runs"]) != (args.batch_sizes, args.runs):
        raise SystemExit(f"{path} was measured with --batch-sizes {report['profile_batch_sizes']} --runs "
                         f"{report['runs']}: run with those, or --fresh")
    rows = [{**r, "commit": r.get("commit", report["commit"])} for r in report["results"]]
    return rows, {k: report[k] for k in ("not_measured", "notes") if k in report}


def _in_order(rows: list[dict]) -> list[dict]:
    """`rows` in MODELS' order (models outside it last)."""
    order = MODELS.split(",")
    return sorted(rows, key=lambda r: order.index(r["model"]) if r["model"] in order else len(order))


def write(args, commit: str, results: list[dict], extra: dict | None = None) -> None:
    """The .json and .md; `extra` may hold `not_measured` (models) and `notes` (paragraphs for the .md)."""
    extra = extra or {}
    report = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "commit": commit,
        "profile_batch_sizes": args.batch_sizes,
        "runs": args.runs,
        "budget_mib": BUDGET_MIB,
        "results": results,
        **extra,
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# Capture and profiling per zoo model: wall time and peak memory",
        "",
        f"Measured with `python benchmarks/capture_profile.py --batch-sizes {args.batch_sizes} --runs {args.runs}` "
        f"on this machine ({report['machine']}), shared with other jobs (load averages below), each row at the "
        "commit in its last column.",
        "Capture: `tag capture MODEL` at the model's default size and batch (traced at B and B+1).",
        f"Profile: `tag profile MODEL --batch-sizes {args.batch_sizes} --runs {args.runs}` (2 warm-up runs each). "
        "Wall times include starting Python and importing TF in each process, and other jobs' load.",
        "",
        "Peak RSS in MiB, sampled from /proc every 50 ms: *parent* is the `tag` process's own high-water mark, "
        "*child* the largest of the processes it started, *tree* the largest sum of all of them at one moment. "
        f"The budget (issue 21) is {BUDGET_MIB} MiB.",
        "",
        "Where it goes: `tag capture` builds and traces the model in a child process (`python -m tag_core.capture`) "
        "and gets the OpGraph back as JSON records, so the parent holds only Python, pandas and DuckDB. "
        "`tag profile` starts no TF itself: a child traces the missing batch sizes, then the profiling child "
        "(`tag_core.profile.timing`, one per batch size for models with over 256 MiB of variable state) runs "
        "the training step, whose own memory (parameters, Adam's two slots, gradients, activations and "
        "TF's ~0.7 GB of libraries) sets the peak; since fb15926 the child caps what TF's allocator may reserve "
        "(`ALLOCATOR_LIMIT_BYTES`, tag_core/profile/profiler.py), which otherwise kept pages no tensor used.",
        "",
        "| model | batch | ops | parameters | capture s | capture parent / child / tree | profile s "
        "| profile parent / child / tree | peak tree | within budget | load 1/5/15 min | commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['model']} | {r['batch_size']} | {r['ops']:,} | {r['parameters']:,} | {r['capture_s']:.1f} | "
            f"{r['capture_parent_mib']:.0f} / {r['capture_child_mib']:.0f} / {r['capture_tree_mib']:.0f} | "
            f"{r['profile_s']:.1f} | {r['profile_parent_mib']:.0f} / {r['profile_child_mib']:.0f} / "
            f"{r['profile_tree_mib']:.0f} | {r['peak_mib']:.0f} | {'yes' if r['peak_mib'] <= BUDGET_MIB else 'no'} "
            f"| {r['load_after']} | {r.get('commit', commit)} |"
        )
    if extra.get("not_measured"):
        lines += ["", f"Not measured in this run: {', '.join(extra['not_measured'])}."]
    for note in extra.get("notes", []):
        lines += ["", note]
    if args.before:
        before = json.loads(Path(args.before).read_text())
        now = {r["model"]: r for r in results}
        lines += [
            "",
            f"Before and after: the same measurement at commit {before['commit']} (capture in the `tag` process, "
            f"profiling children for batch sizes {before['profile_batch_sizes']} in one process), from "
            f"`{Path(args.before).name}`. Peak tree RSS in MiB, the larger of capture's and profile's:",
            "",
            "| model | before: capture parent / child / tree | before: profile parent / child / tree | before peak "
            "| after peak |",
            "|---|---|---|---|---|",
        ]
        for r in before["results"]:
            after = f"{now[r['model']]['peak_mib']:.0f}" if r["model"] in now else "–"
            lines.append(
                f"| {r['model']} | {r['capture_parent_mib']:.0f} / {r['capture_child_mib']:.0f} / "
                f"{r['capture_tree_mib']:.0f} | {r['profile_parent_mib']:.0f} / {r['profile_child_mib']:.0f} / "
                f"{r['profile_tree_mib']:.0f} | {r['peak_mib']:.0f} | {after} |"
            )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
