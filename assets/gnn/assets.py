"""The GNN checkpoint: trains (or fine-tunes) the network that gives MCTS its priors.

Unpartitioned, and materialized by hand: training takes minutes of CPU, so no
upstream change starts it (its automation condition never fires: it has no deps).
It reads the captured graphs and profiles of the configured models from the store and
writes $TAG_HOME/gnn/checkpoint.pt, then publishes it under TAG_ARTIFACTS (ref
`refs/gnn/checkpoint`), which deployment_plan, on any worker, then prefers over the
shipped data/checkpoints/default.pt.
"""

# No `from __future__ import annotations`: Dagster checks the `context` annotation
# as a real type and rejects the string form.

from typing import List, Optional

from dagster import (
    AssetExecutionContext,
    AutomationCondition,
    Config,
    DataVersion,
    MaterializeResult,
    MetadataValue,
    asset,
)
from dagster_duckdb import DuckDBResource
from pydantic import Field

from tag_core import store
from tag_core.capture import BENCHMARK_MODELS, load_op_graph, resolve_model
from tag_core.errors import TagInputError
from tag_core.report import markdown_image
from tag_pipelines.errors import input_errors_as_failures
from tag_pipelines.resources import open_store


class GnnTrainConfig(Config):
    models: List[str] = Field(default=list(BENCHMARK_MODELS), description="Captured models to train on.")
    minutes: float = Field(default=10.0, description="Wall-clock budget of this run.")
    generations: Optional[int] = Field(default=None, description="Stop after this many generations in all.")
    topologies: int = Field(default=64, description="Random training topologies (seeds 0..N-1).")
    seed: int = Field(default=0, description="Training seed.")
    episodes: int = Field(default=6, description="MCTS searches per generation.")
    iterations: int = Field(default=100, description="MCTS iterations per search.")
    fine_tune: bool = Field(default=True, description="Continue from the previous checkpoint when there is one.")


@asset(group_name="plan", kinds={"pytorch"},
       automation_condition=AutomationCondition.any_deps_updated())
def gnn_checkpoint(context: AssetExecutionContext, duckdb: DuckDBResource, config: GnnTrainConfig) -> MaterializeResult:
    """GNN weights (published under TAG_ARTIFACTS as refs/gnn/checkpoint) trained AlphaZero-style on MCTS visit counts, with its curve."""
    from tag_core.gnn.checkpoint import load_checkpoint
    from tag_core.gnn.prior import current_checkpoint, publish_checkpoint, trained_checkpoint
    from tag_core.gnn.problems import ModelSource
    from tag_core.gnn.train import TrainConfig, train
    from tag_core.report import training_curve

    with input_errors_as_failures():
        path = trained_checkpoint()
        previous = current_checkpoint() if config.fine_tune else None  # another worker's, maybe
        resume = load_checkpoint(previous, where="gnn_checkpoint") if previous is not None else None
        names = [resolve_model(m).name for m in config.models]
        with open_store(duckdb) as conn:
            missing = [n for n in names if store.captured_model(conn, n) is None]
            if missing:
                raise TagInputError("models", f"not captured yet: {', '.join(missing)} (materialize training_graph)")
            loaded = {n: (load_op_graph(conn, n), store.load_profiles(conn, n)) for n in names}
        cfg = TrainConfig(models=names, minutes=config.minutes, generations=config.generations,
                          topologies=config.topologies, seed=config.seed, episodes=config.episodes,
                          iterations=config.iterations)
        sources = {n: ModelSource.build(n, g, p, cfg.groups) for n, (g, p) in loaded.items()}
        digest, training, metrics = train(cfg, sources, path, resume=resume, show_progress=False,
                                          log=context.log.info)
        address = publish_checkpoint(path)
    curve = training_curve(metrics)
    return MaterializeResult(
        metadata={
            "path": MetadataValue.path(str(path)),
            "artifact": MetadataValue.text(address),
            "checkpoint_hash": digest[:16],
            "size_mb": path.stat().st_size / 1e6,
            "generations": training["generations"],
            "searches": training["episodes"],
            "examples": training["examples"],
            "training_minutes": training["wall_s"] / 60,
            "fine_tuned_from": resume.short_hash if resume is not None else "none",
            "loss": metrics["loss"] if metrics["loss"] is not None else MetadataValue.text("-"),
            "top1_agreement": metrics["top1_before_training"] if metrics["top1_before_training"] is not None
            else MetadataValue.text("-"),
            "speedup_vs_dp": metrics["speedup_vs_dp"] if metrics["speedup_vs_dp"] is not None
            else MetadataValue.text("-"),
            "training_curve": MetadataValue.md(markdown_image(curve, "training curve")),
            "curve": MetadataValue.json(metrics["curve"]),
        },
        data_version=DataVersion(digest[:16]),
    )
