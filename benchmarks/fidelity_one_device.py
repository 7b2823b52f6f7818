"""One-device fidelity: the simulator's predicted step time against the step `tag run` measures.

    python benchmarks/fidelity_one_device.py [--models mlp,small_cnn,...] [--rounds 2] [--steps 20]
                                             [--warmup 3] [--label after] [--root CHECKOUT]
    python benchmarks/fidelity_one_device.py --repredict LABEL

1. `tag calibrate --local 2 --out local-2.json` once: this machine as two pinned single-core TF servers,
   with the runtime's cost of launching a step (the prediction's per-step term; compute comes from the
   profile).
2. Per model, in a process of its own (wall time and peak RSS): `tag capture`, `tag profile --batch-sizes
   P1,P2` (the profiled sizes), then for P1, an unprofiled size U in between, and P2: `tag emit MODEL
   --strategy single --topology local-2.json --device-kind cpu --batch-size B` (which records the
   simulator's prediction, the calibration applied, in plan.json) and `tag run DIR --measure` (the step
   as a user runs it: one pinned single-threaded server, untraced), `--rounds` times with the batch sizes
   interleaved; measured = the median of every timed step, noise = their interquartile range (IQR).
3. Error = (predicted - measured) / measured, per row; per model and over all models, the median |error|
   at the profiled sizes and at the unprofiled one. Targets (issue 20): <= 10% profiled, <= 15% unprofiled.

`--root CHECKOUT` runs the `tag` commands of another checkout of TAG (a `git worktree` of an older commit,
for the figures before a change); `--label` names the run. Results merge into
benchmarks/fidelity_one_device.json by label, and benchmarks/fidelity_one_device.md shows every label.
$TAG_HOME defaults to a fresh temporary folder (one per label: stores of two code versions differ).
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
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOCAL_TOPOLOGY = "local-2"  # what `tag calibrate --local 2` names the topology it writes
TRANSFORMER = "transformer[layers=2,d_model=128,heads=4,ff=256,vocab=1000,seq_len=16]"
MODELS = {  # reference, profiled batch sizes, the unprofiled one in between: sizes that fit this machine
    "mlp": ("mlp", (32, 128), 64),
    "small_cnn": ("small_cnn", (16, 64), 32),
    "transformer": (TRANSFORMER, (4, 16), 8),
    "resnet101": ("resnet101[image_size=32]", (2, 8), 4),
    "inception_v3": ("inception_v3[image_size=75]", (2, 8), 4),
    "mobilenet_v2": ("mobilenet_v2[image_size=32]", (2, 8), 4),
}
TARGETS = {"profiled": 0.10, "unprofiled": 0.15}
# Runs `argv` as a child and prints its wall time and the peak RSS of the largest process below it.
WRAPPER = ("import json,resource,subprocess,sys,time;t=time.perf_counter();"
           "c=subprocess.run(sys.argv[1:],capture_output=True,text=True);"
           "print(json.dumps({'rc':c.returncode,'wall_s':time.perf_counter()-t,'out':c.stdout,'err':c.stderr[-4000:],"
           "'peak_rss_mib':resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1024}))")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def tag_command(root: Path) -> list[str]:
    """The `tag` of the checkout at `root` (its tag_core first on the path)."""
    return [sys.executable, "-m", "tag_core.cli"]


def environment(root: Path, home: str) -> dict:
    return {**os.environ, "TAG_HOME": home, "PYTHONPATH": os.pathsep.join(filter(None, [str(root),
                                                                                     os.environ.get("PYTHONPATH")]))}


def run(argv: list[str], env: dict, root: Path) -> str:
    done = subprocess.run(argv, env=env, cwd=root, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv[2:5])} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def _warmup_words(warmup: int | None) -> str:
    return "`tag run --measure`'s warm-up, 3 steps or more until a second has passed" if warmup is None \
        else f"{warmup} warm-up steps"


def one_model(key: str, root: Path, home: str, topology: str, rounds: int, steps: int, warmup: int | None) -> dict:
    """Everything for one model (run in a process of its own by main)."""
    reference, profiled, between = MODELS[key]
    env, tag = environment(root, home), tag_command(root)
    sizes = sorted({*profiled, between})
    started = time.perf_counter()
    run([*tag, "capture", reference], env, root)
    captured = time.perf_counter()
    run([*tag, "profile", reference, "--batch-sizes", ",".join(map(str, profiled)), "--runs", "5", "--warmup", "2"],
        env, root)
    profiled_at = time.perf_counter()
    folders, predictions = emit_all(key, sizes, root, home, topology)
    emitted = time.perf_counter()
    seconds: dict[int, list[float]] = {b: [] for b in sizes}
    loads = [os.getloadavg()[0]]
    for r in range(rounds):  # the sizes interleaved (a change of load hits each alike), each round from the next
        for b in sizes[r % len(sizes):] + sizes[:r % len(sizes)]:
            warm = [] if warmup is None else ["--warmup", str(warmup)]  # none: `tag run`'s own warm-up
            out = json.loads(run([*tag, "run", str(folders[b]), "--measure", "--steps", str(steps), *warm, "--json"],
                                 env, root))
            seconds[b] += [s["seconds"] for s in out["steps"] if not s.get("warmup")]
            servers = out.get("servers")
        loads.append(os.getloadavg()[0])
    rows = []
    for b in sizes:
        ts = sorted(seconds[b])
        measured = statistics.median(ts)
        q1, q3 = ts[len(ts) // 4], ts[(3 * len(ts)) // 4]
        rows.append({"batch_size": b, "profiled": b in profiled, "measured_s": measured, "iqr_s": q3 - q1,
                     "steps": len(ts), **against(predictions[b], measured)})
    return {"key": key, "model": reference, "profiled_batches": list(profiled), "unprofiled_batch": between,
            "servers": servers, "rows": rows, "profile_steps": profile_steps(reference, env, root),
            "capture_s": captured - started, "profile_s": profiled_at - captured, "emit_s": emitted - profiled_at,
            "measure_s": time.perf_counter() - emitted, "load_1min": loads}


def emit_all(key: str, sizes: list[int], root: Path, home: str, topology: str) -> tuple[dict, dict]:
    """`tag emit` of the single-device step at each size: its folder and the prediction plan.json records."""
    env, tag = environment(root, home), tag_command(root)
    folders, predictions = {}, {}
    for b in sizes:
        folder = Path(home) / "emit" / f"{key}-b{b}"
        folder.parent.mkdir(parents=True, exist_ok=True)  # tag emit refuses a missing parent folder
        run([*tag, "emit", MODELS[key][0], "--strategy", "single", "--topology", topology, "--device-kind", "cpu",
             "--batch-size", str(b), "--out", str(folder), "--force", "--json"], env, root)
        folders[b] = folder
        predictions[b] = json.loads((folder / "plan.json").read_text()).get("prediction") or {}
    return folders, predictions


def against(prediction: dict, measured: float) -> dict:
    """A row's predicted figures and errors against its measured step."""
    full = prediction.get("iteration_time_s")
    compute = max(prediction.get("busy_s") or [0.0])
    known = full is not None
    return {"predicted_s": full, "predicted_compute_s": compute, "launch_s": full - compute if known else None,
            "error": (full - measured) / measured if known else None, "compute_error": (compute - measured) / measured}


def repredict(report: dict, root: Path, commit: str) -> dict:
    """`report`'s measured steps against predictions the code at `root` makes from the profiles and calibration
    samples stored in the report's home (the calibration fitted again, REFIT): what a change of the cost model
    or of the fits does, without measuring again."""
    topology = str(Path(report["home"]) / f"{LOCAL_TOPOLOGY}.json")
    refit = json.loads(run([sys.executable, "-c", REFIT, LOCAL_TOPOLOGY], environment(root, report["home"]), root))
    say(f"[{report['label']}, re-predicted] calibration {refit['from']} refitted from its samples: {refit['to']}")
    models = []
    for m in report["models"]:
        say(f"[{report['label']}, re-predicted] {m['key']}")
        _, predictions = emit_all(m["key"], [r["batch_size"] for r in m["rows"]], root, report["home"], topology)
        rows = [{**r, **against(predictions[r["batch_size"]], r["measured_s"])} for r in m["rows"]]
        models.append({**m, "rows": rows})
    return {**report, "label": f"{report['label']}, re-predicted", "commit": commit, "refit": refit,
            "repredicted_from": report["label"], "models": models, "summary": summarise(models)}


# The home's calibration fitted again from its stored samples by this code, and stored: the newest
# calibration of the snapshot is the one `tag emit` applies.
REFIT = """import json, sys
from tag_core import store
from tag_core.cluster.calibration import fit_calibration, load_from_store, save_to_store
from tag_core.runtime.calibrate import code_version
conn = store.connect()
old = load_from_store(conn, topology=sys.argv[1])
new = fit_calibration(list(old.samples), topology=old.topology, topology_hash=old.topology_hash, source=old.source,
                      host=old.host, code_version=code_version())
save_to_store(conn, new)
print(json.dumps({"from": old.calibration_hash, "to": new.calibration_hash}))
"""


def profile_steps(reference: str, env: dict, root: Path) -> list[dict]:
    """What the profiler measured of each profiled step (none in a store made before profile_steps existed)."""
    code = ("import json,sys\nfrom tag_core import store\nc=store.connect(read_only=True)\n"
            "try:\n    from tag_core.store.profiles import load_profile_steps\nexcept ImportError:\n    print('[]');sys.exit()\n"
            "f=load_profile_steps(c,sys.argv[1]).groupby('batch_size')[['step_us','launch_us','kernel_us','dispatch_us',"
            "'nodes','graph_nodes']].median().reset_index()\nprint(f.to_json(orient='records'))")
    return json.loads(run([sys.executable, "-c", code, reference], env, root).strip() or "[]")


def median_abs(values: list[float]) -> float | None:
    values = [abs(v) for v in values if v is not None]
    return statistics.median(values) if values else None


def summarise(models: list[dict]) -> dict:
    out = {}
    for which in ("profiled", "unprofiled"):
        rows = [r for m in models for r in m["rows"] if r["profiled"] == (which == "profiled")]
        out[which] = {"median_abs_error": median_abs([r["error"] for r in rows]),
                      "median_abs_compute_error": median_abs([r["compute_error"] for r in rows]), "rows": len(rows),
                      "target": TARGETS[which]}
        out[which]["meets_target"] = (out[which]["median_abs_error"] is not None
                                      and out[which]["median_abs_error"] <= TARGETS[which])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, help="untimed steps before each run's timed ones (default: `tag run "
                                                   "--measure`'s, a few steps and a second)")
    parser.add_argument("--label", default="after")
    parser.add_argument("--root", default=str(ROOT), help="the checkout whose tag runs (default this one)")
    parser.add_argument("--commit", help="what --root holds, for the record (default: its git HEAD)")
    parser.add_argument("--home", help="TAG_HOME for this label (default $TAG_HOME, else a fresh temporary folder); "
                                       "a second run with the same home reuses its captures and calibration")
    parser.add_argument("--repredict", metavar="LABEL",
                        help="predict LABEL's measured steps again with this code, from the profiles and calibration "
                             "samples in its home (no new measurement); writes 'LABEL, re-predicted'")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child: one model, prints JSON
    parser.add_argument("--topology", help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = Path(args.root).resolve()
    home = args.home or os.environ.get("TAG_HOME") or tempfile.mkdtemp(prefix=f"tag-fidelity-1-{args.label}-")
    if args.one:
        print(json.dumps(one_model(args.one, root, home, args.topology, args.rounds, args.steps, args.warmup)))
        return
    commit = args.commit or subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True).stdout.strip()
    path = HERE / "fidelity_one_device.json"
    if args.repredict:
        merged = json.loads(path.read_text())
        report = repredict(merged[args.repredict], root, commit)
        merged[report["label"]] = report
        path.write_text(json.dumps(merged, indent=2) + "\n")
        (HERE / "fidelity_one_device.md").write_text(markdown(merged))
        say(json.dumps(report["summary"]))
        return
    Path(home).mkdir(parents=True, exist_ok=True)
    env = environment(root, home)
    topology = str(Path(home) / f"{LOCAL_TOPOLOGY}.json")
    calibrated = Path(home) / "calibration.json"
    if not calibrated.exists():  # once per home: every model of a label is predicted with the same calibration
        say(f"[{args.label}] calibrating 2 local tasks (TAG_HOME={home}, code {root} at {commit})")
        calibration = wrapped([*tag_command(root), "calibrate", "--local", "2", "--out", topology, "--quiet",
                               "--json"], env, root)
        if calibration["rc"] != 0:
            raise SystemExit(f"tag calibrate failed:\n{calibration['err']}")
        terms = json.loads(calibration["out"])
        calibrated.write_text(json.dumps({"overheads": terms.get("overheads") or terms.get("terms", {}).get("overheads"),
                                          "wall_s": calibration["wall_s"], "peak_rss_mib": calibration["peak_rss_mib"]}))
    merged = json.loads(path.read_text()) if path.exists() else {}
    report = merged.get(args.label) or {"models": []}
    report.update({"label": args.label, "commit": commit, "home": home,
                   "machine": f"{platform.machine()}, {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), "
                              "shared with other jobs", "rounds": args.rounds, "steps": args.steps,
                   "warmup": args.warmup,
                   "calibration": json.loads(calibrated.read_text())})
    for key in args.models.split(","):
        say(f"[{args.label}] {key}: {MODELS[key][0]}")
        child = wrapped([sys.executable, str(Path(__file__).resolve()), "--one", key, "--root", str(root),
                         "--topology", topology, "--rounds", str(args.rounds), "--steps", str(args.steps),
                         *([] if args.warmup is None else ["--warmup", str(args.warmup)]),
                         "--label", args.label], {**env, "TAG_HOME": home}, ROOT)
        if child["rc"] != 0:
            raise SystemExit(f"{key} failed:\n{child['err']}")
        model = {**json.loads(child["out"].strip().splitlines()[-1]), "wall_s": child["wall_s"],
                 "peak_rss_mib": child["peak_rss_mib"]}
        report["models"] = [m for m in report["models"] if m["key"] != key] + [model]  # a rerun replaces the model
        report["models"].sort(key=lambda m: list(MODELS).index(m["key"]))
        for r in model["rows"]:
            say(f"  b={r['batch_size']:>3} {'profiled' if r['profiled'] else 'between '} measured "
                f"{r['measured_s'] * 1e3:8.2f} ms (IQR {r['iqr_s'] * 1e3:.2f})  predicted {r['predicted_s'] * 1e3:8.2f} ms"
                f"  error {r['error']:+.1%}")
        report["wall_s"] = sum(m["wall_s"] for m in report["models"]) + report["calibration"]["wall_s"]
        report["summary"] = summarise(report["models"])
        merged = json.loads(path.read_text()) if path.exists() else {}
        merged[args.label] = report
        path.write_text(json.dumps(merged, indent=2) + "\n")
        (HERE / "fidelity_one_device.md").write_text(markdown(merged))
    say(json.dumps(report.get("summary")))


def wrapped(argv: list[str], env: dict, cwd: Path) -> dict:
    result = subprocess.run([sys.executable, "-c", WRAPPER, *argv], env=env, cwd=cwd, capture_output=True, text=True)
    return json.loads(result.stdout)


def pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:+.1f}%"


def markdown(merged: dict) -> str:
    lines = ["# One-device fidelity: predicted against measured step times", "",
             "Written by `python benchmarks/fidelity_one_device.py` (raw figures in "
             "`benchmarks/fidelity_one_device.json`). Predicted: the simulator's single-device step (the profile's "
             "compute, plus the calibrated per-step launch of `tag calibrate --local 2`), as `tag emit` records it. "
             "Measured: `tag run --measure` of the emitted single-device graph (one pinned single-threaded TF "
             "server), the median of every timed step over the rounds; IQR: their interquartile range. Error = "
             "(predicted - measured) / measured; 'compute only' leaves the launch term out. Targets (issue 20): "
             "median |error| <= 10% at profiled batch sizes, <= 15% at the unprofiled size in between.", ""]
    for label, report in merged.items():
        s = report["summary"]
        lines += [f"## {label} (code at {report['commit']})", "",
                  f"{report['machine']}; {report['rounds']} rounds of {report['steps']} timed steps per size "
                  f"(after {_warmup_words(report.get('warmup', 3))} each); "
                  f"calibration launch cost per step {report['calibration']['overheads'].get('per_step_s', 0) * 1e3:.2f} ms; "
                  f"total wall time {report['wall_s'] / 60:.1f} min.", "",
                  *([f"The measured steps of '{report['repredicted_from']}' (its wall times, peak RSS and loads too); "
                     f"predicted again by the code at {report['commit']} from the profiles stored with them and their "
                     f"calibration's samples, fitted again (`--repredict`; calibration {report['refit']['from']} -> "
                     f"{report['refit']['to']}).", ""] if report.get("repredicted_from") else []),
                  f"**Median |error|: {abs(s['profiled']['median_abs_error']) * 100:.1f}% at profiled sizes "
                  f"({'meets' if s['profiled']['meets_target'] else 'misses'} <= 10%), "
                  f"{abs(s['unprofiled']['median_abs_error']) * 100:.1f}% at the unprofiled size "
                  f"({'meets' if s['unprofiled']['meets_target'] else 'misses'} <= 15%).** Compute only: "
                  f"{s['profiled']['median_abs_compute_error'] * 100:.1f}% and "
                  f"{s['unprofiled']['median_abs_compute_error'] * 100:.1f}%.", "",
                  "| model | batch | profiled | measured ms | IQR ms | predicted ms | error | compute only ms | error "
                  "| median abs error (profiled / between) | wall s | peak RSS MiB | load (1 min) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for m in report["models"]:
            prof = median_abs([r["error"] for r in m["rows"] if r["profiled"]])
            betw = median_abs([r["error"] for r in m["rows"] if not r["profiled"]])
            for i, r in enumerate(m["rows"]):
                tail = (f"{prof * 100:.1f}% / {betw * 100:.1f}% | {m['wall_s']:.0f} | {m['peak_rss_mib']:.0f} | "
                        f"{min(m['load_1min']):.1f}-{max(m['load_1min']):.1f}") if i == 0 else "| | |"
                lines.append(f"| {m['model'] if i == 0 else ''} | {r['batch_size']} | {'yes' if r['profiled'] else 'no'} | "
                             f"{r['measured_s'] * 1e3:.2f} | {r['iqr_s'] * 1e3:.2f} | {r['predicted_s'] * 1e3:.2f} | "
                             f"{pct(r['error'])} | {r['predicted_compute_s'] * 1e3:.2f} | {pct(r['compute_error'])} | "
                             f"{tail} |")
        steps = [(m["model"], p) for m in report["models"] for p in m.get("profile_steps") or []]
        if steps:
            lines += ["", "What the profiler measured of its own steps (one pinned thread, medians over runs): the "
                      "untraced step, its launch, the traced kernels of the OpGraph's ops, the nodes the executor ran "
                      "(of which OpGraph ops) and the executor's time per node beyond the traced kernels.", "",
                      "| model | batch | untraced step ms | launch ms | traced kernels ms | nodes | OpGraph nodes "
                      "| executor µs per node |", "|---|---|---|---|---|---|---|---|"]
            for model, p in steps:
                lines.append(f"| {model} | {p['batch_size']} | {p['step_us'] / 1e3:.2f} | {p['launch_us'] / 1e3:.3f} | "
                             f"{p['kernel_us'] / 1e3:.2f} | {p['nodes']:.0f} | {p['graph_nodes']:.0f} | "
                             f"{p['dispatch_us']:.2f} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
