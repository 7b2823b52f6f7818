"""`make demo`: register demo models and topology snapshots, then materialize the whole asset graph for
every model × topology in this one process's workers (one Dagster run per partition, tagged with one demo
id; see tag_pipelines.demo_runs), printing each stage as it starts and ends, then the plan table, the
report's path and the command that opens the UI on the same instance.

    python -m tag_pipelines.demo [--models mlp,small_cnn,...] [--full] [--topologies 'examples/topologies/*.json']
                                 [--workers N] [--executor in_process|multiprocess]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import sys
import time
import uuid
from pathlib import Path

from dagster import DagsterInstance

from tag_core import store
from tag_core.capture import (
    BENCHMARK_MODELS,
    load_registry,
    registry_path,
    split_models,
)
from tag_core.cluster import topology_directory
from tag_core.errors import TagInputError
from tag_core.files import write_atomically
from tag_core.report import build_report, format_table, plan_table_rows
from tag_pipelines.celery_config import broker_url, check_broker
from tag_pipelines.demo_runs import DEMO_TAG, run_all
from tag_pipelines.devserver import ROOT, prepare_dagster_home
from tag_pipelines.partitions import (
    model_partitions,
    model_topology_partitions,
    topology_partitions,
)
from tag_pipelines.resources import environment

DEMO_MODELS = ["mlp", "small_cnn", "transformer[layers=1,d_model=128,heads=4,ff=256,vocab=1000,seq_len=16]"]
# The demo plans fusion from the cost model, without XLA-timing every pattern (`tune`, 40% of the demo's time
# with it) or the four-mode step (`measure`): `tag fuse MODEL --tune --measure` does both. Plans search 100
# MCTS iterations, as the README's `tag plan` does (the asset's default is 300).
DEMO_CONFIG = {"fusion_plan": {"tune": False, "measure": False}, "deployment_plan": {"budget_iterations": 100}}
# Partitions run side by side, one per core by default: each run is mostly one busy core.
DEFAULT_WORKERS = min(4, os.cpu_count() or 1)


# Stages the demo leaves out: training needs a data set only its user can name (`tag train`).
LEFT_OUT = frozenset({"training_run"})


def stages(partitions_def) -> tuple[str, ...]:
    """Every asset with these partitions but LEFT_OUT, upstream stages first."""
    from tag_pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    keys = [spec.key for spec in defs.resolve_all_asset_specs()
            if spec.partitions_def == partitions_def and spec.key.to_user_string() not in LEFT_OUT]
    return tuple(key.to_user_string() for key in graph.toposorted_asset_keys if key in keys)


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
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                        help=f"partitions materialized at once (default: {DEFAULT_WORKERS}, the cores up to 4)")
    parser.add_argument("--executor", choices=["in_process", "multiprocess"], default="in_process",
                        help="each run's executor (multiprocess starts a process per stage: slower here); "
                             "with TAG_ENV=cluster the runs' steps go to the Celery workers instead")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    try:
        if environment() == "cluster":
            args.executor = "celery"
            if not os.environ.get("DAGSTER_HOME"):
                raise TagInputError("DAGSTER_HOME", "not set; TAG_ENV=cluster uses the instance of .cluster/env")
            check_broker(broker_url(), store.store_wait_s())
            store.connect().close()  # the shared store answers (and has this release's schema) before any run
    except TagInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    models = BENCHMARK_MODELS if args.full else (split_models(args.models) if args.models else DEMO_MODELS)
    started = time.monotonic()

    os.environ["TAG_HOME"] = str(store.tag_home().resolve())
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.executor != "celery":  # cluster mode's instance is the one `make cluster-up` set up
        os.environ.setdefault("DAGSTER_HOME", str((ROOT / ".dagster_home").resolve()))
        prepare_dagster_home(Path(os.environ["DAGSTER_HOME"]))

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
    demo_id = uuid.uuid4().hex[:12]
    plan = {"model": stages(model_partitions), "topology": stages(topology_partitions),
            "pair": stages(model_topology_partitions)}
    runs = len(models) + len(topologies) + len(models) * len(topologies)
    print(f"models: {', '.join(models)}\ntopologies: {', '.join(topologies)} (copied into {watched})\n"
          f"{runs} runs (one per partition), {args.workers} at a time, {args.executor} executor; "
          f"tag {DEMO_TAG}={demo_id}", flush=True)
    results = run_all(models, topologies, plan, demo_id, DEMO_CONFIG, args.workers, args.executor)
    failed = [(work, run_id, why) for work, run_id, ok, why in results if not ok]

    with store.connect(read_only=True) as conn:
        rows = [r for r in plan_table_rows(store.current_plans(conn)) if r["model"] in models and r["topology"] in topologies]
        report = build_report(conn, store.tag_home() / "report")
    print("\n" + format_table(rows))
    print(f"\nHTML report: {report.resolve()}")
    print(f"runs and lineage in the UI (runs tagged {DEMO_TAG}={demo_id}):\n  {ui_command()}")
    for work, run_id, why in failed:
        print(f"FAILED {','.join(work.stages)} [{work.partition}]: {why}" + (f" (run {run_id})" if run_id else ""))
    print(f"demo finished in {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


def ui_command() -> str:
    """`dagster dev` on this instance and store, runnable from the checkout."""
    names = ("DAGSTER_HOME", "TAG_HOME", "TAG_TOPOLOGY_DIR", "TAG_MODELS_FILE", "TAG_CALIBRATION_DIR", "TAG_ENV")
    env = " ".join(f"{name}={shlex.quote(os.environ[name])}" for name in names if name in os.environ)
    return f"cd {shlex.quote(str(ROOT))} && {env} .venv/bin/dagster dev -w workspace.yaml"


if __name__ == "__main__":
    sys.exit(main())
