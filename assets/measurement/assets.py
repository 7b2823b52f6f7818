"""Stage 6: each model × topology's latest plan, emitted for this machine's CPU cores, run and timed beside
what the simulator predicted for it; the measurement goes into `measured_steps`."""

# No `from __future__ import annotations`: Dagster checks the `context` annotation
# as a real type and rejects the string form.

import hashlib
import json

from dagster import (
    AssetExecutionContext,
    Config,
    DataVersion,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)
from dagster_duckdb import DuckDBResource
from pydantic import Field

from tag_core import artifacts, store
from tag_core.capture import resolve_model
from tag_core.capture.steps import model_slug
from tag_core.cluster import recorded_topology
from tag_core.emit import emit_predicted, plan_strategy
from tag_core.errors import TagInputError
from tag_core.report import markdown_image
from tag_core.report.plots import predicted_vs_measured
from tag_core.runtime.measure import SPREAD, MeasureFailed, measure_folder, unmeasurable
from tag_core.simulate.comm import comm_for
from tag_pipelines.errors import input_errors_as_failures
from tag_pipelines.partitions import model_topology_partitions
from tag_pipelines.resources import open_store

from ..planning import deployment_plan
from .checks import STEP_CHECK, step_check


class MeasureConfig(Config):
    steps: int = Field(default=10, description="Timed steps; their median is the measured step.")
    warmup: int = Field(default=2, description="Untimed steps first, at least (TF's one-off graph setup, warm "
                                               "caches); more until a second has passed (tag_core.runtime.warmup).")
    timeout_s: float = Field(default=600.0, description="Seconds the steps may run before the run is stopped.")


def measured_folder(model: str, topology: str):
    """$TAG_HOME/measured/<model>/<topology>/: the plan emitted for CPU devices, with its prediction (`tag run
    DIR --measure` measures it again)."""
    return (store.tag_home() / "measured" / model_slug(model) / topology).resolve()


@asset(
    partitions_def=model_topology_partitions,
    deps=[deployment_plan],
    check_specs=[STEP_CHECK],
    group_name="measure",
    kinds={"tensorflow", "duckdb"},
)
def measured_step(context: AssetExecutionContext, duckdb: DuckDBResource, config: MeasureConfig) -> MaterializeResult:
    """The latest plan emitted with CPU devices under $TAG_HOME/measured/<model>/<topology>/, run here on one
    pinned single-core TF server per task, its median step time stored in `measured_steps` beside the
    prediction. Topologies this machine cannot run as predicted (GPU machines, machines of several devices,
    more tasks than cores) are not measured: the materialization says why, and nothing is stored."""
    keys = context.partition_key.keys_by_dimension
    model_key, topology_key = keys["model"], keys["topology"]
    with input_errors_as_failures():
        if config.steps < 1 or config.warmup < 0:
            raise TagInputError("config", f"steps must be at least 1 and warmup at least 0, got {config.steps} "
                                          f"and {config.warmup}")
        with open_store(duckdb) as conn:
            topology = recorded_topology(conn, topology_key)
        why = unmeasurable(topology)  # the topology decides, before the model is even loaded
        if why is not None:
            context.log.info(f"measured_step: not measured: {why}")
            return MaterializeResult(check_results=[step_check(None, why)], metadata={"measured": False, "why": why},
                                     data_version=DataVersion(f"unmeasured:{topology.content_hash()}"))
        spec = resolve_model(model_key)
        with open_store(duckdb) as conn:  # read what is needed, then let go of the store while measuring
            latest = store.latest_plan(conn, spec.name, topology_key)
            profiles = store.load_profiles(conn, spec.name)
            comm, uncalibrated = comm_for(conn, topology)
        if latest is None:
            raise TagInputError("plan", f"no plan for {spec.name} on {topology_key}; materialize deployment_plan")
        plan_id, plan = latest
        out = measured_folder(spec.name, topology_key)
        emit_predicted(spec, topology, plan_strategy(plan), out, None if profiles.empty else profiles, comm,
                       uncalibrated, plan=plan, force=True)
    try:
        with input_errors_as_failures():  # e.g. local servers this machine refuses to start
            measured = measure_folder(out, config.steps, config.warmup, timeout=config.timeout_s,
                                      echo=context.log.info)
    except MeasureFailed as exc:  # one line for the run's page; the run's report beside it
        raise Failure(description=str(exc), metadata={"run": MetadataValue.md(_indented(exc.lines))}) from None
    row = {**measured.row, "plan_id": plan_id}  # the store's plan, whatever id the emission's lineage carries
    address = artifacts.publish_folder(out, f"measured/{model_slug(spec.name)}/{topology_key}")  # for any worker
    with open_store(duckdb) as conn:
        store.save_measured_step(conn, row)
        history = store.load_measured_steps(conn, topology=topology_key)
    return MaterializeResult(
        check_results=[step_check(row)],
        metadata={**_figures(row, measured), "folder": MetadataValue.path(str(out)), "artifact": address,
                  "plan_id": plan_id,
                  "scatter": MetadataValue.md(_scatter(history, topology_key)),
                  "measurements_on_topology": len(history)},
        data_version=DataVersion(_version(row)),
    )


def _figures(row: dict, measured) -> dict:
    figures = {"measured": True, "measured_ms": row["measured_s"] * 1e3, "spread_ms": row["spread_s"] * 1e3,
               "spread": SPREAD, "steps": row["steps"], "warmup": measured.warmup, "servers": measured.servers,
               "calibration": row["calibration_hash"] or "none: the cost model's defaults"}
    if measured.error is not None:
        figures.update(predicted_ms=row["predicted_s"] * 1e3, error_pct=measured.error * 100)
    return figures


def _scatter(history, topology: str) -> str:
    """Every measurement on this topology, the newest (this one: history is newest first) ringed."""
    rows = [{k: (None if v != v else v) for k, v in r.items()} for r in history.to_dict("records")]  # NaN: None
    png = predicted_vs_measured(rows, title=f"predicted against measured on {topology}", highlight=0)
    return markdown_image(png, f"predicted against measured step time on {topology}")


def _indented(lines: list[str]) -> str:
    return "\n".join(f"    {line}" for line in lines[-60:])


def _version(row: dict) -> str:
    return hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()[:16]
