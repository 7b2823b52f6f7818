"""The store's read queries (what `tag report`, `tag lineage` and the sensors run) on PostgreSQL against
DuckDB, on the same rows: does the analytics side need DuckDB in front of the server?

A fresh PostgreSQL server (local_cluster.start_postgres) and a DuckDB file get the same store: the captured
graphs and profiles of a few zoo models (captured and profiled here, for real), two topology snapshots, and
NIGHTS nights of re-plans of every model x topology (one real plan per pair from `tag_core.plan`, saved again
each night under a new id, as the nightly schedule does). Each query runs REPEATS times per backend; the
medians go to benchmarks/store_queries.json and .md, with this process's peak RSS.

    python benchmarks/store_queries.py [--nights 40]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

MODELS = ["mlp", "small_cnn", "transformer[layers=1,d_model=128,heads=4,ff=256,vocab=1000,seq_len=16]"]
TOPOLOGIES = ["testbed", "cloud"]
REPEATS = 15


def fill(url: str, models: list[str], nights: int) -> None:
    """Capture and profile each model into `url`, plan each pair once, then replay the plans for `nights`."""
    from tag_core import store
    from tag_core.capture import capture_model, resolve_model
    from tag_core.cluster import load_topology
    from tag_core.plan import plan
    from tag_core.search.mcts import Budget
    from tag_core.profile import profile_model

    with store.connect(url) as conn:
        for name in models:
            spec = resolve_model(name)
            graph = capture_model(conn, spec, [spec.batch_size])
            profile_model(conn, spec, batch_sizes=[1, 2, 4], runs=2, warmup=1, show_progress=False)
            profiles = store.load_profiles(conn, spec.name)
            for topology_name in TOPOLOGIES:
                topology = load_topology(ROOT / "examples" / "topologies" / f"{topology_name}.json")
                data = plan(graph, topology, profiles, batch_size=spec.batch_size,
                            budget=Budget(iterations=20), seed=0).to_dict()
                for night in range(nights):
                    store.save_plan_with_snapshot(conn, f"{spec.name}-{topology_name}-{night:03d}", data,
                                                  "benchmark", f"{topology_name}.json")


def queries(model: str) -> dict:
    from tag_core import store

    topology = TOPOLOGIES[0]
    return {
        "current_plans (report, sensors)": lambda c: store.current_plans(c),
        "plan_lineage (tag lineage)": lambda c: store.plan_lineage(c, model, topology),
        "load_plans of a model": lambda c: store.load_plans(c, model),
        "profile_summary (tag profiles)": lambda c: store.profile_summary(c),
        "profile_set_hash": lambda c: store.profile_set_hash(c, model),
        "latest_plan": lambda c: store.latest_plan(c, model, topology),
    }


def time_queries(url: str, named: dict) -> dict:
    from tag_core import store

    medians = {}
    with store.connect(url, read_only=True) as conn:
        for name, query in named.items():
            query(conn)  # warm
            times = []
            for _ in range(REPEATS):
                began = time.perf_counter()
                query(conn)
                times.append(time.perf_counter() - began)
            medians[name] = round(1000 * statistics.median(times), 2)
    return medians


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=40)
    args = parser.parse_args()
    from tag_pipelines import local_cluster
    from tag_pipelines.devserver import free_port

    folder = Path(tempfile.mkdtemp(prefix="tag-store-queries-"))
    folder.chmod(0o711)  # the server runs as the `postgres` user
    os.environ.update({"TAG_HOME": str(folder / "home"), "TAG_ARTIFACTS": str(folder / "artifacts"),
                       "TF_CPP_MIN_LOG_LEVEL": "2"})
    base = local_cluster.start_postgres(folder / "postgres", free_port())
    try:
        backends = {"duckdb": str(folder / "store.duckdb"), "postgres": f"{base}/tag"}
        began = time.perf_counter()
        fill(backends["duckdb"], MODELS, args.nights)
        fill_s = time.perf_counter() - began
        from tag_core import store

        with store.connect(backends["duckdb"], read_only=True) as source, store.connect(backends["postgres"]) as pg:
            rows = store.copy_tables(source, pg)  # the same rows on the server
        from tag_core.capture import resolve_model

        named = queries(resolve_model(MODELS[0]).name)
        medians = {name: time_queries(url, named) for name, url in backends.items()}
    finally:
        local_cluster.stop_postgres(folder / "postgres")
        shutil.rmtree(folder, ignore_errors=True)
    results = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "load": os.getloadavg()[0]},
               "models": MODELS, "topologies": TOPOLOGIES, "nights": args.nights, "rows": rows,
               "fill_s": round(fill_s, 1), "median_ms": medians,
               "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
    (HERE / "store_queries.json").write_text(json.dumps(results, indent=1) + "\n")
    (HERE / "store_queries.md").write_text(markdown(results))
    print(markdown(results))
    return 0


def markdown(results: dict) -> str:
    medians = results["median_ms"]
    lines = ["# The store's read queries: PostgreSQL against DuckDB", "",
             f"`python benchmarks/store_queries.py` on {results['machine']['cpus']} CPUs (load average "
             f"{results['machine']['load']:.1f}): {len(results['models'])} zoo models captured and profiled, "
             f"{len(results['topologies'])} topologies, {results['nights']} nights of re-plans "
             f"({results['rows']['plans']} plan rows, {results['rows']['ops']} op rows, "
             f"{results['rows']['op_profiles']} profile rows), the same rows in both stores. "
             f"Median of {REPEATS} runs per query on one open connection, in ms. Peak RSS "
             f"{results['peak_rss_mib']} MiB.", "",
             "| query | DuckDB ms | PostgreSQL ms | PostgreSQL / DuckDB |", "|---|---:|---:|---:|"]
    for name, duck in medians["duckdb"].items():
        pg = medians["postgres"][name]
        lines.append(f"| {name} | {duck:.2f} | {pg:.2f} | {pg / duck:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
