"""`tag train` measured: the same training as Keras on one device, and its speed beside Keras and tf.distribute.

    python benchmarks/train.py [--repeats 3] [--epochs 8] [--only accuracy|throughput]

1. `tag calibrate --local 2 --out local.json`: this machine as two pinned single-core TF tasks (the cluster every
   row below runs on), stored with its calibration; then per model `tag capture`, `tag profile` and `tag plan
   --topology local.json` (the TAG plan).
2. Accuracy on scikit-learn's bundled 8x8 digits (examples/data/digits.py: 1,437 rows train, 360 validate), for
   mlp[features=64] and small_cnn[image_size=8]: `tag train` under single, dp-nccl, ps, model_parallel, a METIS
   mix of all four options and the TAG plan, each from Keras' initial weights (seed 20240601) in the same data
   order, against plain Keras `fit` on one device fed the very same batches: validation accuracy after
   --epochs epochs and the first 20 step losses (Keras `train_on_batch`).
3. Throughput on the same two tasks, medians of --repeats runs, with peak RSS: `tag train` with the TAG plan
   (and with --servers pinned, where its step would otherwise run without servers) fed from an .npz (mlp
   and small_cnn on digits, the 1-block transformer on a file of token sequences) against
   Keras `fit` on one device (one pinned core, and both cores) and under MirroredStrategy,
   MultiWorkerMirroredStrategy and ParameterServerStrategy, with TF's custom loops where `fit` fails
   (benchmarks/keras_baselines.py), and against `tag run --measure` of the same plan on synthetic batches (the
   input pipeline's cost: the goal is at least 90% of that).

Writes benchmarks/train.json and benchmarks/train.md. $TAG_HOME defaults to a fresh temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "examples" / "data"))  # digits.py
TAG = str(Path(sys.executable).parent / "tag")
INIT_SEED = 20240601
ACCURACY_MODELS = {"mlp": ("mlp[features=64]", False), "small_cnn": ("small_cnn[image_size=8]", True)}
TRANSFORMER = "transformer[layers=1,d_model=32,heads=2,ff=64,vocab=50,seq_len=8]"
STRATEGIES = ["single", "dp-nccl", "ps", "model_parallel", "mixed", "tag"]
KERAS_STRATEGIES = ["keras_single", "keras_two_cores", "mirrored", "multi_worker_mirrored", "multi_worker_mirrored_loop",
                    "parameter_server", "parameter_server_loop"]
FIRST_LOSSES = 20
# Runs `argv` as a child and prints its wall time and the peak RSS of the largest process below it.
WRAPPER = ("import json,resource,subprocess,sys,time;t=time.perf_counter();"
           "c=subprocess.run(sys.argv[1:],capture_output=True,text=True);"
           "print(json.dumps({'rc':c.returncode,'wall_s':time.perf_counter()-t,'out':c.stdout,'err':c.stderr[-4000:],"
           "'peak_rss_mib':resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1024}))")


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def wrapped(argv: list[str], env: dict) -> dict:
    result = subprocess.run([sys.executable, "-c", WRAPPER, *argv], env=env, capture_output=True, text=True)
    return json.loads(result.stdout)


def tag(env: dict, *args: str) -> dict:
    run = wrapped([TAG, *args], env)
    if run["rc"] != 0:
        raise RuntimeError(f"tag {' '.join(args)} failed ({run['rc']}):\n{run['err']}\n{run['out'][-2000:]}")
    return run


# ---- data -------------------------------------------------------------------------------------------------


def write_data(folder: Path) -> dict[str, tuple[str, str | None]]:
    """npz files: digits as features and as images (train, validation), and token sequences for the transformer."""
    import digits

    files = {}
    for name, (_, images) in ACCURACY_MODELS.items():
        key = "images" if images else "features"
        for part in ("train", "validation"):
            x, y = digits.arrays(part, images)
            np.savez(folder / f"digits_{name}_{part}.npz", **{key: x, "labels": y})
        files[name] = (str(folder / f"digits_{name}_train.npz"), str(folder / f"digits_{name}_validation.npz"))
    rng = np.random.default_rng(0)  # a copy task: the decoder sees the source shifted right, predicts the source
    source = rng.integers(1, 50, (6400, 8)).astype(np.int32)
    target = np.concatenate([np.zeros((6400, 1), np.int32), source[:, :-1]], axis=1)
    np.savez(folder / "tokens.npz", source=source, target=target, labels=source)
    files["transformer"] = (str(folder / "tokens.npz"), None)
    return files


# ---- the Keras reference (a child process per model) --------------------------------------------------------


def keras_reference(model: str, train: str, validation: str, epochs: int, seed: int) -> dict:
    """Plain Keras on one device, fed the batches `tag train` takes in its order: validation accuracy per epoch
    (`fit`, then `evaluate`), and the first step losses (`train_on_batch`), from the same initial weights."""
    import keras

    from tag_core.capture import resolve_model
    from tag_core.capture.trace import build_keras
    from tag_core.train.data import load_data

    spec = resolve_model(model)
    data = load_data(train, spec, spec.batch_size)
    held_out = load_data(validation, spec, None)

    def split(*batch):
        return batch[0], batch[1]

    def built():
        keras.utils.set_random_seed(INIT_SEED)
        net, optimizer = build_keras(spec)
        net.compile(optimizer=optimizer, loss=spec.loss, metrics=["accuracy"])
        return net

    net = built()
    accuracy = []
    for epoch in range(epochs):
        net.fit(data.epoch(seed, epoch, spec.batch_size).map(split), epochs=1, verbose=0, shuffle=False)
        accuracy.append(net.evaluate(held_out.in_order(spec.batch_size).map(split), verbose=0, return_dict=True)
                        ["accuracy"])
    fresh = built()
    losses = []
    for x, y in data.epoch(seed, 0, spec.batch_size).map(split).take(FIRST_LOSSES):
        result = fresh.train_on_batch(x, y, return_dict=True)
        losses.append(float(result["loss"]))
    return {"validation_accuracy": accuracy, "first_losses": losses, "steps": epochs * data.steps_per_epoch(spec.batch_size)}


def in_child(function: str, *args) -> dict:
    code = (f"import json,sys; sys.path.insert(0, {str(HERE)!r}); import train; "
            f"print('RESULT ' + json.dumps(train.{function}(*json.loads(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(list(args))], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{function} failed:\n{done.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


# ---- strategies -------------------------------------------------------------------------------------------


def mixed_strategy(env: dict, model: str, topology_file: str, out: Path) -> str:
    """A METIS mix: groups taking every option in turn, on both tasks, task 0 or task 1 (a strategy JSON)."""
    from tag_core import store
    from tag_core.capture.steps import load_op_graph
    from tag_core.cluster.topology_json import load_topology
    from tag_core.plan import make_groups
    from tag_core.simulate import OPTIONS, Strategy

    conn = store.connect(Path(env["TAG_HOME"]) / "tag.duckdb", read_only=True)
    try:
        graph = load_op_graph(conn, model)
    finally:
        conn.close()
    topology = load_topology(topology_file)
    groups = make_groups(graph, None, 8)
    masks = [[1, 1], [1, 0], [0, 1]]
    strategy = Strategy(groups.assignment, np.array([masks[(g // 4 + g) % 3] for g in range(groups.num_groups)],
                                                    dtype=bool),
                        [OPTIONS[g % 4] for g in range(groups.num_groups)], np.ones(topology.num_devices) / 2,
                        name="mixed")
    out.write_text(json.dumps(strategy.to_dict()))
    return str(out)


def strategy_args(name: str, plans: dict, mixed: dict, model_key: str, topology: str) -> list[str]:
    if name == "tag":
        return ["--plan", plans[model_key]]
    return ["--strategy", mixed[model_key] if name == "mixed" else name, "--topology", topology]


# ---- reading a run --------------------------------------------------------------------------------------


def logged(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The TensorBoard scalars of a run: tag -> [(step, value)]."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted((run_dir / "logs").glob("events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(str(path)):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value
                found.setdefault(value.tag, []).append((event.step, number))
    return found


def relative(a: list[float], b: list[float]) -> float:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.max(np.abs(a - b) / np.abs(b)))


# ---- the two parts --------------------------------------------------------------------------------------


def accuracy(env: dict, work: Path, files: dict, plans: dict, mixed: dict, topology: str, epochs: int) -> list[dict]:
    rows = []
    for key, (model, _) in ACCURACY_MODELS.items():
        train, validation = files[key]
        say(f"accuracy: Keras fit of {model}, {epochs} epochs")
        reference = in_child("keras_reference", model, train, validation, epochs, 0)
        for name in STRATEGIES:
            run_dir = work / f"accuracy_{key}_{name}"
            say(f"accuracy: tag train {model} under {name}")
            run = tag(env, "train", model, *strategy_args(name, plans, mixed, key, topology), "--data", train,
                      "--validation-data", validation, "--epochs", str(epochs), "--checkpoint-every", "1000000",
                      "--out", str(run_dir), "--json")
            record = json.loads(run["out"])["run"]
            scalars = logged(run_dir)
            ours = [v for _, v in sorted(scalars["loss"])][:FIRST_LOSSES]
            final = record["validation"]["accuracy"]
            rows.append({"model": model, "strategy": name, "steps": record["steps"], "epochs": epochs,
                         "validation_accuracy": final, "keras_validation_accuracy": reference["validation_accuracy"][-1],
                         "difference_pp": 100 * (final - reference["validation_accuracy"][-1]),
                         "first_losses_max_relative_difference": relative(ours, reference["first_losses"]),
                         "wall_s": run["wall_s"], "peak_rss_mib": run["peak_rss_mib"],
                         "keras_accuracy_per_epoch": reference["validation_accuracy"]})
            say(f"  {final:.4f} against Keras {reference['validation_accuracy'][-1]:.4f}; first {FIRST_LOSSES} losses "
                f"within {rows[-1]['first_losses_max_relative_difference']:.1e}")
    return rows


def throughput(env: dict, work: Path, files: dict, plans: dict, topology: str, repeats: int, steps: int) -> list[dict]:
    from keras_baselines import keras_throughput

    models = {**{k: m for k, (m, _) in ACCURACY_MODELS.items()}, "transformer": TRANSFORMER}
    rows = []
    for key, model in models.items():
        data = files[key][0]
        graph = work / f"graph_{key}"
        tag(env, "emit", model, "--plan", plans[key], "--device-kind", "cpu", "--out", str(graph), "--force")
        for repeat in range(repeats):  # interleaved: a slow minute of the machine hits every row alike
            say(f"throughput: {model}, round {repeat + 1} of {repeats}")
            for servers, runner in (("auto", "tag train (TAG plan)"), ("pinned", "tag train --servers pinned")):
                run_dir = work / f"throughput_{key}_{servers}_{repeat}"
                run = tag(env, "train", model, "--plan", plans[key], "--data", data, "--steps", str(steps),
                          "--checkpoint-every", "1000000", "--servers", servers, "--out", str(run_dir), "--json")
                printed = json.loads(run["out"])
                record = printed["run"]
                rates = [v for s, v in logged(run_dir)["samples_per_second"] if s > 1]
                rows.append({"model": model, "runner": runner, "repeat": repeat,
                             "samples_per_s": float(np.median(rates)), "mean_samples_per_s": record["samples_per_s"],
                             "input_share": record["input_share"], "peak_rss_mib": run["peak_rss_mib"],
                             "wall_s": run["wall_s"], "direct": printed["servers"] == "direct"})
            measured = tag(env, "run", str(graph), "--measure", "--steps", str(min(steps, 200)), "--json")
            timing = json.loads(measured["out"])["measurement"]
            batch = json.loads((graph / "plan.json").read_text())["batch_size"]
            rows.append({"model": model, "runner": "tag run --measure (synthetic batches)", "repeat": repeat,
                         "samples_per_s": batch / timing["median_s"], "peak_rss_mib": measured["peak_rss_mib"],
                         "wall_s": measured["wall_s"]})
            for strategy in KERAS_STRATEGIES:
                result = keras_throughput(model, data, strategy, steps=steps, warmup=20)
                rows.append({"model": model, "runner": f"Keras fit: {strategy}", "repeat": repeat, **result})
    return rows


def prepare(env: dict, work: Path, files: dict) -> tuple[str, dict, dict, dict]:
    topology = str(work / "local.json")
    say("tag calibrate --local 2")
    calibration = tag(env, "calibrate", "--local", "2", "--out", topology)
    plans, mixed = {}, {}
    for key, model in {**{k: m for k, (m, _) in ACCURACY_MODELS.items()}, "transformer": TRANSFORMER}.items():
        say(f"capture, profile and plan {model}")
        tag(env, "capture", model)
        tag(env, "profile", model)
        plans[key] = str(work / f"plan_{key}.json")
        tag(env, "plan", model, "--topology", topology, "--out", plans[key])
        mixed[key] = mixed_strategy(env, model, topology, work / f"mixed_{key}.json")
    summaries = {k: _plan_summary(p) for k, p in plans.items()}
    return topology, plans, mixed, {"calibration_wall_s": calibration["wall_s"], "plans": summaries}


def _plan_summary(path: str) -> dict:
    plan = json.loads(Path(path).read_text())
    options: dict[str, int] = {}
    for group in plan["strategy"]["groups"]:
        where = "+".join(str(i) for i, on in enumerate(group["mask"]) if on)
        options[f"{group['option']} on {where}"] = options.get(f"{group['option']} on {where}", 0) + 1
    return {"groups": plan.get("groups"), "tag_ms": plan["tag"]["iteration_time_s"] * 1e3,
            "baselines_ms": {k: v["iteration_time_s"] * 1e3 for k, v in plan["baselines"].items()},
            "speedup_vs_dp_nccl": plan.get("speedup_vs_dp_nccl"), "groups_by_option": options,
            "batch_shares": plan["strategy"]["batch_shares"]}


def bench_home(prefix: str) -> tuple[dict, Path, dict]:
    """(the children's environment, the work folder, the data files) under $TAG_HOME, else a fresh folder."""
    home = Path(os.environ.get("TAG_HOME") or tempfile.mkdtemp(prefix=prefix))
    env = {**os.environ, "TAG_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "2"}
    os.environ["TAG_HOME"] = str(home)
    work = home / "bench"
    work.mkdir(parents=True, exist_ok=True)
    return env, work, write_data(work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300, help="steps of each throughput run")
    parser.add_argument("--only", choices=("accuracy", "throughput"))
    args = parser.parse_args()
    env, work, files = bench_home("tag-train-bench-")
    start = time.perf_counter()
    topology, plans, mixed, setup = prepare(env, work, files)
    report: dict = {"machine": platform.node(), "cores": len(os.sched_getaffinity(0)), "setup": setup,
                    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                             text=True).stdout.strip(), "epochs": args.epochs,
                    "repeats": args.repeats, "steps": args.steps, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    old = json.loads((HERE / "train.json").read_text()) if (HERE / "train.json").exists() else {}
    report["accuracy"] = old.get("accuracy", []) if args.only == "throughput" else \
        accuracy(env, work, files, plans, mixed, topology, args.epochs)
    report["throughput"] = old.get("throughput", []) if args.only == "accuracy" else \
        throughput(env, work, files, plans, topology, args.repeats, args.steps)
    report["wall_s"] = time.perf_counter() - start
    (HERE / "train.json").write_text(json.dumps(report, indent=1, default=str))
    (HERE / "train.md").write_text(markdown(report))
    say(f"wrote {HERE / 'train.md'}")


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(np.median(values)) if values else None


def markdown(report: dict) -> str:
    lines = ["# `tag train`: the same training as Keras, and its speed", "",
             f"`python benchmarks/train.py` at {report['commit']}, {report['started']}, on {report['cores']} cores; "
             f"every row on the two pinned single-core TF tasks of `tag calibrate --local 2` (calibrated). "
             f"{report['wall_s'] / 60:.0f} minutes in all.", "",
             "## Accuracy on the bundled digits", "",
             f"Validation accuracy after {report['epochs']} epochs (1,437 training rows, 360 validation rows), from "
             f"Keras' initial weights in the same data order as plain Keras `fit` on one device; the first "
             f"{FIRST_LOSSES} step losses against Keras `train_on_batch` on the same batches.", "",
             "| model | strategy | steps | validation accuracy | Keras fit | difference (pp) | first losses: max "
             "relative difference | wall s | peak RSS MiB |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["accuracy"]:
        lines.append(f"| {r['model']} | {r['strategy']} | {r['steps']} | {r['validation_accuracy']:.4f} | "
                     f"{r['keras_validation_accuracy']:.4f} | {r['difference_pp']:+.2f} | "
                     f"{r['first_losses_max_relative_difference']:.1e} | {r['wall_s']:.0f} | {r['peak_rss_mib']:.0f} |")
    lines += ["", "## Throughput", "",
              f"Samples/s, medians of {report['repeats']} interleaved runs of {report['steps']} steps (per run: the "
              f"median over its steps after the first, as `tag run --measure` takes the median step), peak RSS of "
              f"the largest process.", "",
              "| model | runner | samples/s | runs | peak RSS MiB | note |", "|---|---|---:|---:|---:|---|"]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in report["throughput"]:
        groups.setdefault((r["model"], r["runner"]), []).append(r)
    for (model, runner), rows in groups.items():
        refused = next((r for r in rows if r.get("refused") or r.get("failed")), None)
        if refused:
            word = "refused" if refused.get("refused") else "failed"
            lines.append(f"| {model} | {runner} | {word} | {len(rows)} | - | {refused[word]} |")
            continue
        rate, rss = _median(rows, "samples_per_s"), max(r.get("peak_rss_mib") or 0 for r in rows)
        note = rows[0].get("note") or ""
        if "input_share" in rows[0]:
            note = f"input pipeline {_median(rows, 'input_share'):.1%} of the step"
            if rows[0].get("direct"):
                note += "; the step on one device, in the trainer's own session (no servers)"
        lines.append(f"| {model} | {runner} | {rate:,.0f} | {len(rows)} | {rss:.0f} | {note} |")
    lines += ["", "Ratios of the medians:", ""] + _ratios(groups) + [
        "", "Where the time of a `tag train` step goes, against Keras on one core: "
            "[train_trace.md](train_trace.md) (`python benchmarks/train_trace.py`)."]
    return "\n".join(lines) + "\n"


def _ratios(groups: dict[tuple[str, str], list[dict]]) -> list[str]:
    """Per model: tag train against tag run --measure, the fastest Keras runner and the fastest tf.distribute one."""
    rates: dict[str, dict[str, float]] = {}
    for (model, runner), rows in groups.items():
        rate = _median(rows, "samples_per_s")
        if rate:
            rates.setdefault(model, {})[runner] = rate
    lines = []
    for model, by_runner in rates.items():
        ours = by_runner.get("tag train (TAG plan)")
        if not ours:
            continue
        keras = {r: v for r, v in by_runner.items() if r.startswith("Keras fit")}
        distributed = {r: v for r, v in keras.items() if not r.endswith(("keras_single", "keras_two_cores"))}
        parts = [f"{ours / by_runner['tag run --measure (synthetic batches)']:.0%} of `tag run --measure`"] \
            if "tag run --measure (synthetic batches)" in by_runner else []
        for label, pool in (("the fastest Keras runner", keras), ("the fastest tf.distribute strategy", distributed)):
            if pool:
                best = max(pool, key=pool.get)
                parts.append(f"{ours / pool[best]:.2f}x {label} ({best.split(': ')[-1]})")
        lines.append(f"- {model}: tag train at " + ", ".join(parts))
    return lines


if __name__ == "__main__":
    main()
