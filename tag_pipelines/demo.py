"""`make demo`: register demo models and topology snapshots, then materialize the whole asset graph
for every model × topology through Dagster's own CLI, and print the plan table and the report path.

    python -m tag_pipelines.demo [--models mlp,small_cnn,...] [--full] [--topologies 'examples/topologies/*.json']
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from dagster import DagsterInstance, MultiPartitionKey

from tag_core import store
from tag_core.capture import BENCHMARK_MODELS, load_registry, registry_path
from tag_core.cluster import topology_directory
from tag_core.files import write_atomically
from tag_core.report import build_report, format_table, plan_table_rows
from tag_pipelines.devserver import ROOT, prepare_dagster_home
from tag_pipelines.partitions import model_partitions, model_topology_partitions, topology_partitions

DEMO_MODELS = ["mlp", "small_cnn", "transformer[layers=1,d_model=128,heads=4,ff=256,vocab=1000,seq_len=16]"]
# The demo skips fusion's four-mode step timing (`tag fuse MODEL --measure` does it).
DEMO_CONFIG = {"fusion_plan": {"measure": False}}


def stages(partitions_def) -> list[str]:
    """Every asset with these partitions, upstream stages first."""
    from tag_pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    keys = [spec.key for spec in defs.resolve_all_asset_specs() if spec.partitions_def == partitions_def]
    ordered = [key for key in graph.toposorted_asset_keys if key in keys]
    return [key.to_user_string() for key in ordered]


def materialize(select: list[str], partition: str, env: dict) -> None:
    dagster = Path(sys.executable).with_name("dagster")
    config = {"ops": {op: {"config": c} for op, c in DEMO_CONFIG.items() if op in select}}
    command = [str(dagster), "asset", "materialize", "-m", "tag_pipelines.definitions", "--select", ",".join(select),
               "--partition", partition, "--config-json", json.dumps(config)]
    started = time.monotonic()
    print(f"  materialize {','.join(select)} [{partition}] ...", flush=True)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"dagster asset materialize failed for {select} [{partition}]:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    print(f"    done in {time.monotonic() - started:.0f} s", flush=True)


def register_models(models: list[str]) -> None:
    path = registry_path()
    existing = [m.reference for m in load_registry(path)] if path.exists() else []
    merged = existing + [m for m in models if m not in existing]
    write_atomically(path, "models:\n" + "".join(f"  - {json.dumps(m)}\n" for m in merged))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help=f"comma-separated model references (default: {','.join(DEMO_MODELS)})")
    parser.add_argument("--full", action="store_true", help="the six benchmark models (slow on a CPU)")
    parser.add_argument("--topologies", default=str(ROOT / "examples" / "topologies" / "*.json"))
    args = parser.parse_args(argv)
    models = BENCHMARK_MODELS if args.full else (args.models.split(",") if args.models else DEMO_MODELS)
    started = time.monotonic()

    env = dict(os.environ)
    env.setdefault("DAGSTER_HOME", str((ROOT / ".dagster_home").resolve()))
    env["TAG_HOME"] = str(store.tag_home().resolve())
    os.environ.update(DAGSTER_HOME=env["DAGSTER_HOME"], TAG_HOME=env["TAG_HOME"])
    prepare_dagster_home(Path(env["DAGSTER_HOME"]))

    register_models(models)
    watched = topology_directory()
    watched.mkdir(parents=True, exist_ok=True)
    topologies = []
    for source in sorted(glob.glob(args.topologies)):
        target = watched / Path(source).name
        shutil.copyfile(source, target.with_name(f".{target.name}.tmp"))
        os.replace(target.with_name(f".{target.name}.tmp"), target)
        topologies.append(target.stem)
    if not topologies:
        sys.exit(f"no topology files match {args.topologies}")

    instance = DagsterInstance.get()
    instance.add_dynamic_partitions(model_partitions.name, models)
    instance.add_dynamic_partitions(topology_partitions.name, topologies)
    print(f"models: {', '.join(models)}\ntopologies: {', '.join(topologies)} (copied into {watched})")
    for model in models:
        materialize(stages(model_partitions), model, env)
    for topology in topologies:
        materialize(stages(topology_partitions), topology, env)
    pair = stages(model_topology_partitions)
    for model in models:
        for topology in topologies:
            materialize(pair, str(MultiPartitionKey({"model": model, "topology": topology})), env)

    with store.connect(read_only=True) as conn:
        rows = [r for r in plan_table_rows(store.current_plans(conn)) if r["model"] in models and r["topology"] in topologies]
        report = build_report(conn, store.tag_home() / "report")
    print("\n" + format_table(rows))
    print(f"\nHTML report: {report.resolve()}")
    print(f"demo finished in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
