"""`train(...)`: check everything, emit the plan into the run folder, and supervise the trainer.

Everything the user gave is checked before anything is written or any server starts: the model, the plan,
the data against the captured inputs, and on `resume` the last complete checkpoint against this model, graph,
global batch and data. Then the run folder gets

    RUN_DIR/graph/         the emitted step of the plan (`tag emit`'s folder; replaced when a resumed run
                           brings another plan)
    RUN_DIR/run.json       the run's settings, as the trainer reads them
    RUN_DIR/checkpoints/   tag_core.train.checkpoints
    RUN_DIR/logs/          TensorBoard event files: loss and samples/s per step, validation metrics per epoch
    RUN_DIR/model.keras    the user's Keras model with the trained values

and the trainer (tag_core.train.trainer) runs as `tag run`'s worker does: against pinned single-core servers,
in-process ones, or one task of a real cluster (tag_core.runtime.supervisor.run_child); a local step on one
device of task 0 runs in the trainer's own session instead (tag_core.runtime.direct).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tag_core.capture.models.spec import ModelSpec
from tag_core.cluster.topology import Topology
from tag_core.errors import TagInputError

from .checkpoints import KEEP, check_compatible, latest_checkpoint, read_state
from .data import TrainingData, load_data
from .progress import TrainingEvents, TrainingProgress

STEP_TIMEOUT_S = 120.0
CHECKPOINT_EVERY = 100
CURVE_POINTS = 500  # steps of the loss curve the store keeps (evenly spaced)


@dataclass
class TrainResult:
    ok: bool
    run_dir: Path
    error: str | None
    lines: list[str]
    events: TrainingEvents
    first_step: int
    wall_s: float
    data: TrainingData
    emission: Any = field(repr=False)
    row: dict[str, Any] | None = None
    servers: str | None = None  # where the step ran: "direct", "pinned", "shared" or "cluster"

    @property
    def losses(self) -> list[float]:
        return [s["loss"] for s in self.events.steps]

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def train(spec: ModelSpec, run_dir: str | Path, data: str, *, plan: dict[str, Any] | None = None,
          strategy: Any = None, topology: Topology | None = None, batch_size: int | None = None,
          validation: str | None = None, steps: int | None = None, epochs: int | None = None,
          checkpoint_every: int = CHECKPOINT_EVERY, keep: int = KEEP, resume: bool = False, seed: int = 0,
          device_kind: str | None = None, cluster: str | Path | None = None, task_index: int = 0,
          servers: str = "auto", step_timeout: float = STEP_TIMEOUT_S, show_progress: bool = False,
          echo: Callable[[str], None] | None = None, profiles=None) -> TrainResult:
    """Train `spec` with `plan` (as `tag plan` writes it) or `strategy` (a Strategy or a name, with `topology`)
    on `data` for `steps` steps in all, or `epochs` epochs (default 1), into `run_dir`; see the module docstring.
    A task of `cluster` other than 0 serves until stopped."""
    from tag_core.emit.emitter import emit, plan_strategy, plan_topology
    from tag_core.emit.folder import write_emission
    from tag_core.runtime.supervisor import STARTUP_S, run_child

    from .trainer import FIRST_STEP_EXTRA_S

    start = time.perf_counter()
    run_dir = Path(run_dir)
    _check_run_dir(run_dir, resume)
    if steps is not None and epochs is not None:
        raise TagInputError("--steps", "give --steps or --epochs, not both")
    device_kind = device_kind or ("gpu" if cluster is not None else "cpu")
    if plan is not None:
        try:
            chosen = plan_strategy(plan)
        except TagInputError as exc:
            raise TagInputError(f"--plan: {exc.where}", exc.problem) from None
        topology = plan_topology(plan, topology)
        if batch_size is not None and plan.get("batch_size") not in (None, batch_size):
            raise TagInputError("--batch-size", f"the plan is for a batch of {plan['batch_size']}, not {batch_size}")
    elif strategy is None or topology is None:
        raise TagInputError("--plan", "give --plan, or --topology with --strategy")
    else:
        chosen = strategy
    if cluster is not None:
        from tag_core.runtime.supervisor import check_cluster

        check_cluster(Path(cluster), topology.num_machines)
        if not 0 <= task_index < topology.num_machines:
            raise TagInputError("--task-index", f"must lie in [0, {topology.num_machines}) for this topology")
    batch = int((plan or {}).get("batch_size") or batch_size or spec.batch_size)
    training = load_data(data, spec, batch, "--data", spec.timeout)
    held_out = load_data(validation, spec, None, "--validation-data", spec.timeout) if validation else None
    emitting_plan = plan if plan is not None else ({"batch_size": batch} if batch != spec.batch_size else None)
    emission = emit(spec, topology, chosen, device_kind, plan=emitting_plan, profiles=profiles)
    identity = {"model": spec.name, "graph_hash": emission.graph.content_hash(), "batch_size": batch,
                "data_hash": training.content_hash}
    variables = [{"name": v.name, "shape": list(v.shape), "dtype": v.dtype} for v in emission.reference.variables]
    restored = latest_checkpoint(run_dir) if resume else None
    first = 0
    if restored is not None:
        state = read_state(restored)
        check_compatible(state, identity, variables, restored)
        first = state["step"]
    per_epoch = training.steps_per_epoch(batch)
    total = steps if steps is not None else (epochs or 1) * per_epoch
    mode = _server_mode(emission, servers, cluster)  # before anything is written: --servers may be refused
    graph = write_emission(emission, run_dir / "graph", force=True)
    plan_id = _plan_id(plan)
    settings = {"model": spec.reference or spec.name, "model_timeout": spec.timeout, "graph": str(graph.resolve()),
                "run_dir": str(run_dir.resolve()), "data": training.reference,
                "validation": held_out.reference if held_out else None, "seed": seed, "steps": total,
                "checkpoint_every": checkpoint_every, "keep": keep, "step_timeout": step_timeout,
                "resume": str(restored.resolve()) if restored else None, "identity": identity, "plan_id": plan_id}
    from tag_core.files import write_atomically

    write_atomically(run_dir / "run.json", json.dumps(settings, indent=1))
    meta = json.loads((graph / "plan.json").read_text())["emission"]
    command = [sys.executable, "-m", "tag_core.train.trainer", str(run_dir / "run.json")]
    if mode == "direct":
        command.append("--direct")
    if cluster is not None:
        command += ["--cluster", str(cluster), "--task-index", str(task_index)]
    progress = TrainingProgress(show_progress, batch)
    say = echo or progress.echo
    if mode == "direct":
        say("every op lies on one device of task 0: the step runs in the trainer's own session on one core, "
            "without servers (--servers pinned keeps them)")
    serving = cluster is not None and task_index != 0
    quiet = None if serving else STARTUP_S + FIRST_STEP_EXTRA_S + 2 * step_timeout
    outcome = run_child(command, meta, mode, say, None, step_timeout, handle=progress, silence_s=quiet)
    progress.close()
    result = TrainResult(ok=outcome.ok and progress.events.done is not None, run_dir=run_dir, error=outcome.error,
                         lines=outcome.lines, events=progress.events, first_step=first,
                         wall_s=time.perf_counter() - start, data=training, emission=emission, servers=mode)
    if result.error is None and not result.ok:
        result.error = "the trainer ended without finishing"
    result.row = None if serving else training_row(result, emission, plan, plan_id, held_out, restored)
    return result


def _server_mode(emission, servers: str, cluster) -> str:
    """`tag run`'s modes (tag_core.runtime.supervisor.server_mode), and "direct" (tag_core.runtime.direct),
    the default where a local CPU step lies on one device of task 0 and would otherwise run pinned."""
    from tag_core.runtime.direct import on_one_device
    from tag_core.runtime.supervisor import server_mode

    facts = {"tasks": [m.count for m in emission.topology.machines], "device_kind": emission.device_kind}
    one_device = cluster is None and emission.device_kind == "cpu" and on_one_device(emission.emitted.graph_def)
    if servers == "direct":
        if not one_device:
            why = "--cluster runs a task of a real cluster" if cluster is not None else \
                "the step's ops lie on more than one device (or on GPUs)"
            raise TagInputError("--servers", f"direct: {why}; a direct session holds one CPU device of task 0")
        return "direct"
    mode = server_mode(facts, servers, cluster)
    return "direct" if servers == "auto" and mode == "pinned" and one_device else mode


def _check_run_dir(run_dir: Path, resume: bool) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise TagInputError("--out", f"{run_dir} exists and is not a folder")
    if resume:
        if latest_checkpoint(run_dir) is None:
            raise TagInputError("--resume", f"{run_dir} holds no complete checkpoint to resume from")
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise TagInputError("--out", f"{run_dir} holds a run; pass --resume to go on from its last checkpoint, "
                                     f"or choose another folder")


def _plan_id(plan: dict[str, Any] | None) -> str | None:
    if plan is None or "topology_snapshot" not in plan:  # a bare strategy file is no stored plan
        return None
    from tag_core.plan.plan_file import plan_id

    return plan_id(plan)


def training_row(result: TrainResult, emission, plan, plan_id, held_out, restored) -> dict[str, Any]:
    """The run's `training_runs` row (tag_core.store.training)."""
    import hashlib

    events = result.events
    losses = result.losses
    lineage = {**((plan or {}).get("lineage") or {}), **emission.lineage}
    every = max(1, len(losses) // CURVE_POINTS)
    curve = [[s["step"], s["loss"]] for s in events.steps[::every]]
    if events.steps and curve[-1][0] != events.steps[-1]["step"]:
        curve.append([events.steps[-1]["step"], events.steps[-1]["loss"]])
    last = events.checkpoints[-1]["path"] if events.checkpoints else None
    validation = next((e["validation"] for e in reversed(events.epochs) if e.get("validation")), None)
    status = "done" if result.ok else "nonfinite" if events.nonfinite else "failed"
    run_id = hashlib.sha256(f"{result.run_dir.resolve()}:{time.time_ns()}".encode()).hexdigest()[:16]
    done = events.done or {}
    return {
        "run_id": run_id, "model": emission.spec.name, "topology": emission.topology.name,
        "strategy": emission.strategy.name or "plan", "plan_id": plan_id,
        "graph_hash": emission.graph.content_hash(), "topology_hash": emission.topology.content_hash(),
        "profile_hash": lineage.get("profile_hash"), "calibration_hash": lineage.get("calibration"),
        "data": result.data.reference, "data_hash": result.data.content_hash,
        "validation_hash": held_out.content_hash if held_out else None, "batch_size": emission.batch_size,
        "first_step": result.first_step, "steps": events.steps[-1]["step"] if events.steps else result.first_step,
        "status": status, "final_loss": losses[-1] if losses else None, "best_loss": min(losses) if losses else None,
        "validation": validation, "samples_per_s": done.get("samples_per_s"), "input_share": done.get("input_share"),
        "checkpoint": last, "model_file": (events.model or {}).get("path"), "run_dir": str(result.run_dir.resolve()),
        "wall_s": result.wall_s, "resumed_from": str(restored) if restored else None, "loss_curve": curve,
    }
