"""Stage 7: each model × topology trained with its latest plan on the data the run's config names, here on
this machine's CPU cores, as `tag train` does; the run goes into `training_runs`. A materialization after a
re-plan goes on from the last checkpoint under the new plan."""

# No `from __future__ import annotations`: Dagster checks the `context` annotation
# as a real type and rejects the string form.

from typing import Optional

from dagster import AssetExecutionContext, Config, DataVersion, Failure, MaterializeResult, MetadataValue, asset
from dagster_duckdb import DuckDBResource
from pydantic import Field

from tag_core import artifacts, store
from tag_core.capture import resolve_model
from tag_core.capture.steps import model_slug
from tag_core.errors import TagInputError
from tag_core.report import loss_curve, markdown_image
from tag_core.train import latest_checkpoint, train
from tag_pipelines.errors import input_errors_as_failures
from tag_pipelines.partitions import model_topology_partitions
from tag_pipelines.resources import open_store

from ..planning import deployment_plan


class TrainConfig(Config):
    data: str = Field(description="Training data: an .npz file (one array per model input, and `labels`) or "
                                  "path/to/file.py:function returning a tf.data.Dataset of (inputs, labels).")
    validation_data: Optional[str] = Field(default=None, description="Data evaluated at each epoch's end.")
    epochs: int = Field(default=1, description="Train until this many epochs are done (unless steps is set).")
    steps: Optional[int] = Field(default=None, description="Train until this many steps are done.")
    checkpoint_every: int = Field(default=100, description="Steps between checkpoints.")
    seed: int = Field(default=0, description="Seed of the data's shuffling.")
    step_timeout_s: float = Field(default=120.0, description="Seconds a step may take before the run stops.")
    resume: bool = Field(default=True, description="Go on from the run folder's last checkpoint when it has one "
                                                   "(under the latest plan, which may differ from the one it was "
                                                   "saved under).")


def training_folder(model: str, topology: str):
    """$TAG_HOME/training/<model>/<topology>/: the run folder (graph, checkpoints, logs, model.keras)."""
    return (store.tag_home() / "training" / model_slug(model) / topology).resolve()


@asset(
    partitions_def=model_topology_partitions,
    deps=[deployment_plan],
    group_name="train",
    kinds={"tensorflow", "keras", "duckdb"},
)
def training_run(context: AssetExecutionContext, duckdb: DuckDBResource, config: TrainConfig) -> MaterializeResult:
    """The latest plan trained on `data` under $TAG_HOME/training/<model>/<topology>/ (checkpoints, TensorBoard
    logs, model.keras), recorded in `training_runs`; its metadata plots the loss curve."""
    keys = context.partition_key.keys_by_dimension
    model_key, topology_key = keys["model"], keys["topology"]
    with input_errors_as_failures():
        if config.epochs < 1 or (config.steps is not None and config.steps < 1) or config.checkpoint_every < 1:
            raise TagInputError("config", "epochs, steps and checkpoint_every must be at least 1")
        spec = resolve_model(model_key)
        with open_store(duckdb) as conn:  # read the plan, then let go of the store while training
            latest = store.latest_plan(conn, spec.name, topology_key)
            profiles = store.load_profiles(conn, spec.name)
        if latest is None:
            raise TagInputError("plan", f"no plan for {spec.name} on {topology_key}; materialize deployment_plan")
        _, plan = latest
        out = training_folder(spec.name, topology_key)
        ref = f"training/{model_slug(spec.name)}/{topology_key}"
        if config.resume and latest_checkpoint(out) is None:
            artifacts.restore_folder(ref, out)  # the checkpoints another worker's run left
        resume = config.resume and latest_checkpoint(out) is not None
        result = train(spec, out, config.data, plan=plan, validation=config.validation_data,
                       steps=config.steps, epochs=None if config.steps else config.epochs,
                       checkpoint_every=config.checkpoint_every, resume=resume, seed=config.seed,
                       step_timeout=config.step_timeout_s, echo=context.log.info,
                       profiles=None if profiles.empty else profiles)
    address = artifacts.publish_folder(out, ref)  # checkpoints (even a failed run's) and model.keras, for any worker
    if result.row["model_file"]:  # the store keeps addresses, not this disk's paths
        result.row["model_file"] = artifacts.put_file(result.row["model_file"])
    with open_store(duckdb) as conn:
        store.save_training_run(conn, result.row)
    if not result.ok:
        raise Failure(description=result.error or "training failed", metadata={"run_dir": str(out)})
    row = result.row
    validation = [[e["step"], e["validation"]["loss"]] for e in result.events.epochs if e.get("validation")]
    metadata = {
        "run_id": row["run_id"], "plan_id": row["plan_id"], "steps": row["steps"], "first_step": row["first_step"],
        "final_loss": row["final_loss"], "best_loss": row["best_loss"], "samples_per_s": row["samples_per_s"],
        "input_share": row["input_share"], "data_hash": row["data_hash"], "wall_s": row["wall_s"],
        "run_dir": MetadataValue.path(str(out)), "artifact": address,
        "model_file": MetadataValue.path(artifacts.url(row["model_file"]) if row["model_file"] else "-"),
        "loss_curve": MetadataValue.md(markdown_image(
            loss_curve(row["loss_curve"], validation, f"{spec.name} on {topology_key}"), "loss per step")),
        **{f"validation_{name}": value for name, value in (row["validation"] or {}).items()},
    }
    return MaterializeResult(metadata=metadata, data_version=DataVersion(row["run_id"]))
