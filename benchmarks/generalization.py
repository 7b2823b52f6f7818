"""Generalisation of the GNN prior (TAG paper Tables VII and VIII), plus its costs.

--part topologies (Table VII): 100 random topologies with seeds from 1,000,000 (training
    uses seeds below --topologies, default 64), each with a zoo model drawn from the seed
    (redrawn while DP-NCCL runs out of memory on it). MCTS runs in the "dp" space
    (tag_core/gnn/problems.py: equal shares, no fusion, no overlap, so its default plan is
    DP-NCCL) with the GNN prior and with uniform priors, same MCTS seed, until a plan beats
    DP-NCCL or 200 iterations pass (200 then counts as 200: "not found").
--part models (Table VIII): leave-one-out. For each zoo model, a network trained without
    it and one trained on all six (same seed and number of generations) each guide
    `tag_core.plan.planner.plan` on testbed.json and cloud.json; we compare the plans' times.
--part costs: checkpoint size, training time (from the checkpoint), GNN inference time
    per MCTS step, peak RSS.

Graphs and CPU profiles come from $TAG_HOME (default .tag-bench/gnn): the six zoo models at
their default sizes (vgg19, resnet101, inception_v3, mobilenet_v2 at 224/299 px, batch 32;
transformer and bert_base as defined in tag_core/capture/models/text.py).
Writes benchmarks/generalization.json, benchmarks/generalization.md and PNG figures.

    python benchmarks/generalization.py --part topologies --checkpoint data/checkpoints/default.pt
    python benchmarks/generalization.py --part models --generations 12
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("TAG_HOME", str(ROOT / ".tag-bench" / "gnn"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
from generalization_report import figure_models, figure_topologies, write_markdown  # noqa: E402

MODELS = ["vgg19", "resnet101", "inception_v3", "mobilenet_v2", "transformer", "bert_base"]
CAP = 200
OUT = HERE / "generalization.json"


def load_sources(models: list[str]) -> dict:
    from tag_core import store
    from tag_core.capture import load_op_graph
    from tag_core.gnn.problems import ModelSource

    conn = store.connect(read_only=True)
    try:
        return {m: ModelSource.build(m, load_op_graph(conn, m), store.load_profiles(conn, m)) for m in models}
    finally:
        conn.close()


def iterations_to_beat(problem, prior, seed: int) -> tuple[int | None, int, float]:
    """(first iteration whose plan beats DP-NCCL or None, iterations run, seconds)."""
    search = problem.search(seed=seed, prior=prior)
    clock = time.perf_counter()
    while search.iterations < CAP and search.best.first_better is None:
        search.iterate()
    return search.best.first_better, search.iterations, time.perf_counter() - clock


def part_topologies(checkpoint: str, cases: int, first: int = 0) -> list[dict]:
    from tag_core.cluster import random_topology
    from tag_core.errors import TagInputError
    from tag_core.gnn.prior import load_prior
    from tag_core.gnn.problems import BENCHMARK_SEED_BASE, build_problem

    sources = load_sources(MODELS)
    choice = load_prior(checkpoint)
    gnn = choice.prior
    rows = []
    for i in range(first, first + cases):
        seed = BENCHMARK_SEED_BASE + i
        rng = np.random.default_rng(seed)
        topo = random_topology(seed)
        problem, redraws = None, 0
        for _ in range(len(MODELS) * 2):
            model = MODELS[int(rng.integers(len(MODELS)))]
            try:
                problem = build_problem(sources[model], topo, "dp")
            except TagInputError:
                problem = None
            if problem is not None and not problem.dp_oom:
                break
            redraws += 1
        if problem is None or problem.dp_oom:
            rows.append({"seed": seed, "skipped": "every model runs out of memory under DP-NCCL"})
            continue
        calls, seconds = gnn.calls, gnn.seconds
        g_first, g_its, g_wall = iterations_to_beat(problem, gnn, seed)
        u_first, u_its, u_wall = iterations_to_beat(problem, None, seed)
        row = {"seed": seed, "model": model, "redraws": redraws, "machines": topo.num_machines,
               "devices": topo.num_devices, "actions": problem.evaluator.space.size,
               "gnn": g_first, "uniform": u_first, "gnn_wall_s": g_wall, "uniform_wall_s": u_wall,
               "gnn_calls": gnn.calls - calls, "gnn_inference_s": gnn.seconds - seconds}
        rows.append(row)
        print(f"{i:3d} {model:13s} M={topo.num_machines} D={topo.num_devices:2d}  gnn {g_first}  uniform {u_first}",
              flush=True)
    return rows


def summarize_topologies(rows: list[dict]) -> dict:
    done = [r for r in rows if "skipped" not in r]
    out = _summary(done)
    out["skipped"] = len(rows) - len(done)
    # One machine: every mask is that machine, and no plan beat DP-NCCL there with either prior.
    out["multi_machine"] = _summary([r for r in done if r["machines"] > 1])
    out["goal_met"] = out["gnn"]["median"] <= out["uniform"]["median"] / 5
    return out


def _summary(done: list[dict]) -> dict:
    out = {"cases": len(done)}
    for key in ("gnn", "uniform"):
        its = np.array([r[key] if r[key] is not None else CAP for r in done], dtype=float)
        out[key] = {"median": float(np.median(its)), "mean": float(its.mean()), "p90": float(np.percentile(its, 90)),
                    "not_found": int(sum(r[key] is None for r in done)), "first_iteration": int((its == 1).sum()),
                    "median_wall_s": float(np.median([r[f"{key}_wall_s"] for r in done]))}
    calls = sum(r["gnn_calls"] for r in done)
    out["gnn_inference_ms_per_call"] = 1e3 * sum(r["gnn_inference_s"] for r in done) / max(calls, 1)
    return out


def part_models(generations: int, iterations: int, seed: int, workdir: Path, shipped: str) -> list[dict]:
    """Leave-one-out training, then plan each held-out model with both networks."""
    from tag_core.cluster import load_topology
    from tag_core.gnn.checkpoint import load_checkpoint
    from tag_core.gnn.prior import GnnPrior
    from tag_core.gnn.problems import build_problem
    from tag_core.gnn.train import TrainConfig, train
    from tag_core.plan import plan
    from tag_core.search import Budget

    sources = load_sources(MODELS)
    workdir.mkdir(parents=True, exist_ok=True)
    nets = {}
    for held_out in [None, *MODELS]:
        name = "all" if held_out is None else f"without-{held_out}"
        path = workdir / f"{name}.pt"
        models = [m for m in MODELS if m != held_out]
        if not path.exists() or load_checkpoint(path).training["generations"] < generations:
            cfg = TrainConfig(models=models, generations=generations, minutes=None, seed=seed)
            resume = load_checkpoint(path) if path.exists() else None
            train(cfg, sources, path, resume=resume, show_progress=False,
                  log=lambda line, n=name: print(f"  {n}: {line}", flush=True))
        nets[name] = load_checkpoint(path)
    nets["shipped"] = load_checkpoint(shipped)  # longer trained, saw every model: a reference
    rows = []
    for model in MODELS:
        for topo_name in ("testbed", "cloud"):
            topo = load_topology(ROOT / "examples" / "topologies" / f"{topo_name}.json")
            src = sources[model]
            row = {"model": model, "topology": topo_name}
            dp_space = build_problem(src, topo, "dp")
            for label, ckpt in (("seen", nets["all"]), ("unseen", nets[f"without-{model}"]), ("uniform", None),
                                ("shipped", nets["shipped"])):
                prior = GnnPrior(ckpt.net) if ckpt is not None else None
                # Table VII's measure too, on this model: iterations to beat DP-NCCL in the DP-NCCL space.
                row[f"{label}_beat_dp_it"] = iterations_to_beat(dp_space, prior, seed)[0]
                result = plan(src.graph, topo, src.profiles, groups=src.groups, budget=Budget(iterations=iterations),
                              seed=seed, prior=prior, mcmc_simulations=1)
                row[label] = result.tag.time_s
                row["dp_nccl"] = result.baselines["dp_nccl"]
            row["unseen_over_seen"] = row["unseen"] / row["seen"]
            rows.append(row)
            print(f"{model:13s} {topo_name:8s} seen {row['seen'] * 1e3:8.2f} ms  unseen {row['unseen'] * 1e3:8.2f} ms"
                  f"  uniform {row['uniform'] * 1e3:8.2f} ms  shipped {row['shipped'] * 1e3:8.2f} ms"
                  f"  ratio {row['unseen_over_seen']:.3f}  beat DP at " +
                  " ".join(f"{k}={row[f'{k}_beat_dp_it']}" for k in ("seen", "unseen", "uniform", "shipped")),
                  flush=True)
    return rows


def inference_ms(checkpoint: str, repeats: int = 30) -> list[dict]:
    """Median time of one prior call (featurize the state, run the network) on the example topologies."""
    from tag_core.cluster import load_topology
    from tag_core.gnn.features import ProblemFeatures
    from tag_core.gnn.prior import load_prior
    from tag_core.gnn.problems import build_problem

    prior = load_prior(checkpoint).prior
    out = []
    for model in ("vgg19", "resnet101"):
        source = load_sources([model])[model]
        for topo_name in ("testbed", "cloud"):
            problem = build_problem(source, load_topology(ROOT / "examples" / "topologies" / f"{topo_name}.json"))
            ev = problem.evaluator
            clock = time.perf_counter()
            pf = ProblemFeatures(ev)
            static_ms = (time.perf_counter() - clock) * 1e3
            actions = np.full(pf.G, ev.space.all_machines)
            result = ev.result(actions)
            feat, net = [], []
            for depth in range(repeats):
                clock = time.perf_counter()
                sample = pf.sample(actions, np.arange(depth % pf.G), depth % pf.G, result)
                mid = time.perf_counter()
                prior.probabilities([sample])
                feat.append(mid - clock)
                net.append(time.perf_counter() - mid)
            out.append({"model": model, "topology": topo_name, "groups": pf.G, "actions": ev.space.size,
                        "static_features_ms": static_ms, "featurize_ms": 1e3 * statistics.median(feat),
                        "network_ms": 1e3 * statistics.median(net)})
    return out


def part_costs(checkpoint: str) -> dict:
    from tag_core.gnn.checkpoint import load_checkpoint

    ckpt = load_checkpoint(checkpoint)
    params = sum(p.numel() for p in ckpt.net.parameters())
    return {"inference": inference_ms(checkpoint), "checkpoint": _shown(checkpoint), "checkpoint_bytes": Path(checkpoint).stat().st_size, "parameters": params,
            "training_wall_s": ckpt.training.get("wall_s"), "generations": ckpt.training.get("generations"),
            "episodes": ckpt.training.get("episodes"), "examples": ckpt.training.get("examples"),
            "training_config": ckpt.training.get("config"), "metrics": {k: v for k, v in ckpt.metrics.items()
                                                                         if k != "curve"}}


def _shown(path: str) -> str:
    full = Path(path).resolve()
    return str(full.relative_to(ROOT) if full.is_relative_to(ROOT) else full)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("topologies", "models", "costs", "report"), required=True)
    parser.add_argument("--checkpoint", default=str(ROOT / "data" / "checkpoints" / "default.pt"))
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--first", type=int, default=0, help="first case (to continue an interrupted run)")
    parser.add_argument("--generations", type=int, default=15, help="per leave-one-out network")
    parser.add_argument("--iterations", type=int, default=100, help="MCTS iterations per plan (models part)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=str(ROOT / ".tag-bench" / "gnn" / "loo"))
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    data = json.loads(OUT.read_text()) if OUT.exists() else {}
    clock = time.perf_counter()
    if args.part == "topologies":
        rows = part_topologies(args.checkpoint, args.cases, args.first)
        if args.first:
            rows = [r for r in data.get("topologies", {}).get("rows", []) if r["seed"] < rows[0]["seed"]] + rows
        data["topologies"] = {"rows": rows, "summary": summarize_topologies(rows), "checkpoint": _shown(args.checkpoint),
                              "wall_s": time.perf_counter() - clock}
        figure_topologies(data["topologies"], HERE / "generalization_topologies.png")
    elif args.part == "models":
        rows = part_models(args.generations, args.iterations, args.seed, Path(args.workdir), args.checkpoint)
        ratios = [r["unseen_over_seen"] for r in rows]
        data["models"] = {"rows": rows, "generations": args.generations, "iterations": args.iterations,
                          "max_ratio": max(ratios), "mean_ratio": statistics.fmean(ratios),
                          "goal_met": max(ratios) <= 1.05, "wall_s": time.perf_counter() - clock}
        figure_models(data["models"], HERE / "generalization_models.png")
    elif args.part == "costs":
        data["costs"] = part_costs(args.checkpoint)
    elif args.part == "report":  # summaries, figures and markdown again from the stored rows
        if "topologies" in data:
            data["topologies"]["summary"] = summarize_topologies(data["topologies"]["rows"])
            figure_topologies(data["topologies"], HERE / "generalization_topologies.png")
        if "models" in data:
            figure_models(data["models"], HERE / "generalization_models.png")
    if args.part != "report":  # parts may run at once: merge this one into what is on disk now
        latest = json.loads(OUT.read_text()) if OUT.exists() else {}
        latest[args.part] = data[args.part]
        latest.setdefault("peak_rss_mib", {})[args.part] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        data = latest
    if args.note:
        data.setdefault("notes", {})[args.part] = args.note
    tmp = OUT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(OUT)
    write_markdown(data, HERE / "generalization.md")
    print(f"wrote {OUT} and {HERE / 'generalization.md'}")


if __name__ == "__main__":
    main()
