"""Re-planning a fleet in cluster mode: throughput with one Celery worker and with two, and the store's write
latency under concurrent writers, DuckDB against PostgreSQL.

1. `local_cluster.up` starts PostgreSQL, Redis and two workers under a fresh folder (no daemon: the runs are
   launched here). Every model's and topology's upstream stages run once (not timed).
2. The nightly re-plan, timed: one Dagster run of `deployment_plan` per model × topology (cold, no warm start,
   so every round does the same work), ORCHESTRATORS runs in flight, their steps on the workers. First with
   both workers, then with worker 2 stopped. Partitions per minute = pairs / wall minutes.
3. Store writes: WRITERS processes each save WRITES plans (one plan row with its topology snapshot, one
   transaction, a real plan from step 2) as `tag plan` does, opening the store for each write; the latency of
   each open + write + close, p50 and p99, on a DuckDB file and on the PostgreSQL server.
Peak RSS per process: VmHWM of each worker and orchestrator. Writes benchmarks/fleet.json and fleet.md.

    python benchmarks/fleet.py [--models 6] [--iterations 100]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tag_pipelines import demo_runs, local_cluster  # noqa: E402

MODELS = ["mlp", "small_cnn", "transformer[layers=1,d_model=128,heads=4,ff=256,vocab=1000,seq_len=16]",
          "mlp[layers=4,hidden=512]", "mobilenet_v2[image_size=32,classes=10]",
          "bert_base[layers=1,hidden=128,heads=2,ff=256,vocab=1000,seq_len=16]"]
TOPOLOGIES = {
    "testbed": None, "cloud": None,  # examples/topologies
    "two-boxes": {"name": "two-boxes", "inter_gbps": 25, "machines": [
        {"name": "box-a", "gpu": "V100-16GB", "count": 2, "intra_gbps": 100},
        {"name": "box-b", "gpu": "T4", "count": 2, "intra_gbps": 64}]},
    "three-racks": {"name": "three-racks", "inter_gbps": 10, "machines": [
        {"name": f"node-{i}", "gpu": gpu, "count": 4, "intra_gbps": 64}
        for i, gpu in enumerate(["V100-16GB", "T4", "P100-16GB"])]},
}
MODEL_STAGES = ("training_graph", "op_profiles", "op_groups")
TOPOLOGY_STAGES = ("cluster_topology", "calibration")
ORCHESTRATORS = 4
WRITERS, WRITES = 8, 40
ROUNDS = 2  # of each worker count
MIB = 1024 * 1024


def vm_hwm_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def orchestrator_peak(_: int) -> float:
    return vm_hwm_mib(os.getpid()) or 0.0


def run_works(works: list, config: dict) -> tuple[float, list[tuple], list[float]]:
    """Every work's run, ORCHESTRATORS at a time: (wall s, (run id, ok, why) each, orchestrators' peak MiB)."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(ORCHESTRATORS, mp_context=context) as pool:
        list(pool.map(orchestrator_peak, range(ORCHESTRATORS)))  # start them before the clock
        started = time.perf_counter()
        results = list(pool.map(demo_runs.execute, works, ["fleet"] * len(works), [config] * len(works),
                                ["celery"] * len(works)))
        wall = time.perf_counter() - started
        peaks = list(pool.map(orchestrator_peak, range(ORCHESTRATORS * 4)))
    failed = [r for r in results if not r[1]]
    if failed:
        raise SystemExit(f"{len(failed)} runs failed, e.g. {failed[0]}")
    return wall, results, peaks


def writer(args: tuple[str, int, dict]) -> list[float]:
    from tag_core import store

    url, index, plan = args
    latencies = []
    for n in range(WRITES):
        began = time.perf_counter()
        with store.connect(url) as conn:
            store.save_plan_with_snapshot(conn, f"w{index:02d}-{n:04d}", plan, "fleet", None)
        latencies.append(time.perf_counter() - began)
    return latencies


def write_latency(url: str, plan: dict) -> dict:
    from tag_core import store

    with store.connect(url):  # the schema exists before the clock starts
        pass
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(WRITERS, mp_context=context) as pool:
        latencies = sorted(x for part in pool.map(writer, [(url, i, plan) for i in range(WRITERS)]) for x in part)
    with store.connect(url, read_only=True) as conn:
        rows = len(store.load_plans(conn, plan["model"]))
    return {"writes": len(latencies), "rows": rows, "p50_ms": round(1000 * statistics.median(latencies), 1),
            "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1),
            "max_ms": round(1000 * latencies[-1], 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=len(MODELS))
    parser.add_argument("--iterations", type=int, default=100, help="MCTS iterations of each plan")
    args = parser.parse_args()
    models = MODELS[: args.models]
    root = Path(tempfile.mkdtemp(prefix="tag-fleet-"))
    root.chmod(0o711)  # the server runs as the `postgres` user, which must reach its folder
    settings = local_cluster.up(root, workers=2, with_dagster=False)
    os.environ.update(settings)
    os.environ.update({"TAG_HOME": str(root / "orchestrator"), "TF_CPP_MIN_LOG_LEVEL": "2"})
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                 "load_at_start": os.getloadavg()[0]}, "models": models,
                     "topologies": list(TOPOLOGIES), "iterations": args.iterations}
    try:
        watched = Path(settings["TAG_TOPOLOGY_DIR"])
        watched.mkdir(parents=True, exist_ok=True)
        for name, snapshot in TOPOLOGIES.items():
            source = ROOT / "examples" / "topologies" / f"{name}.json"
            (watched / f"{name}.json").write_text(source.read_text() if snapshot is None else json.dumps(snapshot))
        from dagster import DagsterInstance

        from tag_pipelines.partitions import model_partitions, topology_partitions

        with DagsterInstance.get() as instance:
            instance.add_dynamic_partitions(model_partitions.name, models)
            instance.add_dynamic_partitions(topology_partitions.name, list(TOPOLOGIES))
        upstream = [demo_runs.Work("topology", t, TOPOLOGY_STAGES) for t in TOPOLOGIES]
        upstream += [demo_runs.Work("model", m, MODEL_STAGES) for m in models]
        print(f"upstream stages of {len(models)} models and {len(TOPOLOGIES)} topologies ...", flush=True)
        results["upstream_s"] = round(run_works(upstream, {})[0], 1)
        pairs = [demo_runs.pair_work(m, t, ("deployment_plan",)) for m in models for t in TOPOLOGIES]
        config = {"deployment_plan": {"budget_iterations": args.iterations, "warm_start": False}}
        rounds, worker_peaks = {2: [], 1: []}, {}
        for workers in (2, 1) * ROUNDS:  # alternating, so that drift in the machine's load hits both alike
            if workers == 1:
                worker_peaks["worker-2"] = max(worker_peaks.get("worker-2", 0), round(vm_hwm_mib(_pid(root, 2)) or 0))
                local_cluster.stop_pid_file(root / "pids" / "worker-2.pid")
            wall, _, peaks = run_works(pairs, config)
            rounds[workers].append({"pairs": len(pairs), "wall_s": round(wall, 1),
                                    "partitions_per_min": round(len(pairs) / (wall / 60), 2),
                                    "orchestrator_peak_mib": round(max(peaks))})
            print(f"{workers} worker(s): {rounds[workers][-1]}", flush=True)
            if workers == 1:
                _start_worker(root, 2)
        results["rounds"] = rounds
        results["speedup_two_workers"] = round(_median_rate(rounds[2]) / _median_rate(rounds[1]), 2)
        results["worker_peak_mib"] = {"worker-1": round(vm_hwm_mib(_pid(root, 1)) or 0), **worker_peaks}
        from tag_core import store

        with store.connect(settings["TAG_STORE"], read_only=True) as conn:
            plan = json.loads(store.load_plans(conn, models[0]).iloc[0].plan)
        results["store_writes"] = {
            "duckdb": write_latency(str(root / "latency.duckdb"), plan),
            "postgres": write_latency(_database(settings["TAG_STORE"], "latency"), plan),
        }
        print(results["store_writes"], flush=True)
    finally:
        local_cluster.down(root)
    results["machine"]["load_at_end"] = os.getloadavg()[0]
    (HERE / "fleet.json").write_text(json.dumps(results, indent=1) + "\n")
    (HERE / "fleet.md").write_text(markdown(results))
    print(markdown(results))
    return 0


def _median_rate(rounds: list[dict]) -> float:
    return statistics.median(r["partitions_per_min"] for r in rounds)


def _start_worker(root: Path, index: int) -> None:
    """Worker `index` again, as `local_cluster.up` starts it; back once it says it is ready."""
    log = root / "logs" / f"worker-{index}.log"
    seen = log.read_text(errors="replace").count("ready.") if log.exists() else 0
    local_cluster.spawn(local_cluster.worker_argv(f"tag-worker-{index}"),
                        {**os.environ, "TAG_HOME": str(root / "workers" / str(index))}, log,
                        root / "pids" / f"worker-{index}.pid")
    deadline = time.monotonic() + 120
    while log.read_text(errors="replace").count("ready.") <= seen and time.monotonic() < deadline:
        time.sleep(0.5)


def _pid(root: Path, worker: int) -> int:
    return int((root / "pids" / f"worker-{worker}.pid").read_text())


def _database(url: str, name: str) -> str:
    """A new database `name` beside the store's, on the same server; its URL."""
    from tag_core.store.postgres import create_databases

    server = url.rsplit("/", 1)[0]
    create_databases(server, [name])
    return f"{server}/{name}"


def markdown(results: dict) -> str:
    machine, rounds, writes = results["machine"], results["rounds"], results["store_writes"]
    lines = ["# Re-planning a fleet in cluster mode", "",
             f"`python benchmarks/fleet.py` on {machine['cpus']} CPUs (load average {machine['load_at_start']:.1f} "
             f"at the start, {machine['load_at_end']:.1f} at the end): {len(results['models'])} models × "
             f"{len(results['topologies'])} topologies, one `deployment_plan` run per pair ({results['iterations']} "
             f"MCTS iterations, no warm start), {ORCHESTRATORS} runs in flight, steps on Celery workers over Redis, "
             "the store on PostgreSQL. Upstream stages (capture, profile, groups, snapshots) ran once before, in "
             f"{results['upstream_s']:.0f} s.", "",
             f"Rounds alternate, two workers then one, {ROUNDS} of each.", "",
             "| workers | pairs | wall s, each round | partitions / min (median) | largest orchestrator MiB |",
             "|---:|---:|---|---:|---:|"]
    for workers in ("1", "2"):
        runs = rounds.get(workers) or rounds.get(int(workers))
        walls = ", ".join(f"{r['wall_s']:.0f}" for r in runs)
        lines.append(f"| {workers} | {runs[0]['pairs']} | {walls} | "
                     f"{_median_rate(runs):.2f} | {max(r['orchestrator_peak_mib'] for r in runs)} |")
    lines += ["", f"Two workers against one: **{results['speedup_two_workers']:.2f}×** (medians). Worker peak RSS: "
              + ", ".join(f"{k} {v} MiB" for k, v in results["worker_peak_mib"].items()) + ".", "",
              f"Store writes: {WRITERS} processes × {WRITES} plans each (a plan row with its snapshot, one "
              "transaction), each write opening and closing the store as `tag plan` does.", "",
              "| store | writes | rows | p50 ms | p99 ms | max ms |", "|---|---:|---:|---:|---:|---:|"]
    for name, w in writes.items():
        lines.append(f"| {name} | {w['writes']} | {w['rows']} | {w['p50_ms']} | {w['p99_ms']} | {w['max_ms']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
