"""The process that trains: the emitted step on TF's distributed runtime, fed the run's data, checkpointed.

`tag train` (tag_core.train.run) starts it as a child, as `tag run` starts its worker, so that a hung step or
a lost task ends with the process. It reads the run's settings from RUN_DIR/run.json and reports one JSON
object per line on stdout: {"event": "start" | "step" | "checkpoint" | "epoch" | "model" | "nonfinite" |
"serving" | "error" | "input_error" | "done", ...}.

Per step the client waits for the next prefetched batch (timed as the input pipeline's share), feeds it whole
to the emitted step and runs it under the step timeout. Every `checkpoint_every` steps and at the end it reads
every copy of every variable, checks that the copies of each agree, and writes a checkpoint of one value per
variable (tag_core.train.checkpoints). At each epoch's end the user's Keras model takes those values and is
evaluated on the validation data; at the end it is written as RUN_DIR/model.keras.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from tag_core.runtime.parent_watch import exit_with_parent  # imports tag_core.runtime first: see its supervisor
from tag_core.runtime.worker import (
    Distributed,
    FolderError,
    _headline,
    _load_graph_def,
    add_task_arguments,
    connect_tasks,
    report,
    waiting_collectives,
)

FIRST_STEP_EXTRA_S = 300.0  # the first step also sets the graph up on every task
STEP_GRACE_S = 10.0  # beyond the step timeout, before the supervisor stops a client whose step never returns
# What a checkpoint, a validation or the export may take at most (they read every variable or a whole data set).
LONG_PHASE_S = 1800.0
# Copies of a variable may differ by this much, relative to its largest value, before the run calls it a
# divergence: replicas that compute their own update (duplicate) sum in their own order.
COPY_TOLERANCE = 1e-4


class CopiesDiverged(RuntimeError):
    pass


class NotFinite(RuntimeError):
    """A variable holds NaN or Inf (a loss function can clip NaN away while its gradient still carries it)."""


def copy_values(distributed: Distributed, meta: dict, options) -> tuple[list[np.ndarray], float]:
    """One value per variable (its first copy) and the largest relative difference of any other copy from it;
    CopiesDiverged past COPY_TOLERANCE, naming the variable and the devices."""
    copies: dict[int, list[tuple[int, np.ndarray]]] = {}
    for i, j, value in distributed.variables(options):
        copies.setdefault(i, []).append((j, value))
    values, worst = [], 0.0
    for i, v in enumerate(meta["variables"]):
        (_, first), *others = sorted(copies[i], key=lambda c: c[0])
        scale = float(np.max(np.abs(first))) if first.size else 0.0
        for j, other in others:
            if np.array_equal(first, other, equal_nan=first.dtype.kind == "f"):
                continue
            difference = float(np.max(np.abs(first.astype(np.float64) - other))) / max(scale, 1e-12)
            worst = max(worst, difference)
            if not difference <= COPY_TOLERANCE:
                devices = v["copies"]
                raise CopiesDiverged(f"copies of {v['name']} differ: {devices[0][1]} and {devices[j][1]} by "
                                     f"{difference:.2e} of its largest value (at most {COPY_TOLERANCE:g} is rounding)")
        if first.dtype.kind == "f" and not np.isfinite(first).all():
            raise NotFinite(v["name"])
        values.append(first)
    return values, worst


def named_tasks(message: str, addresses: list[str] | None) -> str:
    """"; task K (...) is unreachable" for tasks a TF error names whose address no longer answers."""
    named = sorted({int(k) for k in re.findall(r"/job:worker/replica:0/task:(\d+)", message)})
    if not addresses:
        return "".join(f"; the error names task {k}" for k in named[:3])
    gone = []
    for k, address in enumerate(addresses):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=2.0):
                pass
        except OSError:
            gone.append(k)
    return "".join(f"; task {k} ({addresses[k]}) does not answer" for k in gone) or \
        "".join(f"; the error names task {k}" for k in named[:3])


class Run:
    """One run of the training loop, from the settings `tag train` wrote."""

    def __init__(self, settings: dict[str, Any], args):
        self.settings = settings
        self.args = args
        self.folder = Path(settings["graph"])
        self.run_dir = Path(settings["run_dir"])
        self.plan = json.loads((self.folder / "plan.json").read_text())
        self.meta = self.plan["emission"]
        self.batch = int(self.plan["batch_size"])
        self.names = [v["name"] for v in self.meta["variables"]]

    def quiet_s(self, first: bool = False) -> float:
        """How long the supervisor waits for the next event during a step (tag_core.runtime.supervisor.run_child)."""
        return self.settings["step_timeout"] + STEP_GRACE_S + (FIRST_STEP_EXTRA_S if first else 0.0)

    def options(self, first: bool = False):
        import tensorflow as tf

        seconds = self.settings["step_timeout"] + (FIRST_STEP_EXTRA_S if first else 0.0)
        return tf.compat.v1.RunOptions(timeout_in_ms=int(seconds * 1000))

    def main(self) -> int:
        import keras
        import tensorflow as tf

        from tag_core.capture.models import resolve_model
        from tag_core.emit.emitter import INIT_SEED

        from .checkpoints import read_state, read_values
        from .data import load_data
        from .keras_model import TrainedModel

        s = self.settings
        spec = resolve_model(s["model"], self.batch, s.get("model_timeout"))
        data = load_data(s["data"], spec, self.batch, "--data", s.get("model_timeout"))
        validation = load_data(s["validation"], spec, None, "--validation-data", s.get("model_timeout")) \
            if s.get("validation") else None
        keras.utils.set_random_seed(INIT_SEED)  # the emitted step's initial values: Keras' own initialisers
        self.keras = TrainedModel(spec)
        if self.args.direct:
            from tag_core.runtime.direct import local_step

            local = _load_graph_def(self.folder, self.meta, s["step_timeout"], False, runs=s["steps"])
            graph_def, self.meta = local_step(local, self.meta)
            target, self.servers, on_cpu = "", [], False
        else:
            connected = connect_tasks(self.args, self.meta)
            if connected is None:
                return 0
            target, self.servers, on_cpu = connected
            graph_def = _load_graph_def(self.folder, self.meta, s["step_timeout"], on_cpu, runs=s["steps"])
        resume = s.get("resume")
        if resume:
            state = read_state(Path(resume))
            values, step = read_values(Path(resume), self.meta["variables"]), state["step"]
        else:
            by_path = self.keras.by_path
            values, step = [np.asarray(by_path[n].numpy()) for n in self.names], 0
        self.distributed = Distributed(graph_def, self.meta, target, soft=bool(self.args.cluster),
                                       threads=1 if self.args.direct else None)
        per_epoch = data.steps_per_epoch(self.batch)
        total = s["steps"]
        report("start", tasks=len(self.meta["tasks"]), devices=sum(self.meta["tasks"]), ops=len(graph_def.node),
               batch=self.batch, rows=data.rows, steps_per_epoch=per_epoch, dropped=data.rows - per_epoch * self.batch,
               first_step=step, steps=total, resumed_from=resume, gpu_as_cpu=on_cpu, quiet_s=self.quiet_s(first=True))
        self.stage, self.step = "initialising variables", step
        try:
            self.distributed.initialise(values, self.options(first=True))
            return self.loop(data, validation, step, total, per_epoch, values)
        except tf.errors.OpError as exc:
            message = str(exc)
            addresses = json.loads(Path(self.args.cluster).read_text())["cluster"]["worker"] \
                if self.args.cluster else None
            report("error", stage=self.stage, kind=type(exc).__name__,
                   message=_headline(message) + named_tasks(message, addresses),
                   waiting=waiting_collectives(message, self.meta))
            return 1
        except CopiesDiverged as exc:
            report("error", stage=self.stage, kind="CopiesDiverged", message=str(exc), waiting=[])
            return 1
        except NotFinite as exc:
            report("nonfinite", step=self.step, variable=str(exc), checkpoint=self.latest())
            return 1

    def loop(self, data, validation, step: int, total: int, per_epoch: int, values: list[np.ndarray]) -> int:
        from .tensorboard import ScalarLog

        s = self.settings
        writer = ScalarLog(str(self.run_dir / "logs"))
        epoch_losses: list[float] = []
        timed = {"steps": 0, "step_s": 0.0, "data_s": 0.0}
        first = True
        while step < total:
            epoch, position = divmod(step, per_epoch)
            batches = data.batches(s["seed"], epoch, self.batch, position)
            waited = time.perf_counter()
            for batch in batches:
                data_s = time.perf_counter() - waited
                self.stage = f"step {step + 1}"
                start = time.perf_counter()
                loss = self.distributed.step(batch, self.options(first))
                seconds = time.perf_counter() - start
                if not math.isfinite(loss):
                    writer.flush()
                    report("nonfinite", step=step + 1, loss=str(loss), checkpoint=self.latest())
                    return 1
                step += 1
                self.step = step
                if not first:  # the first includes the graph's set-up on every task
                    timed["steps"] += 1
                    timed["step_s"] += seconds
                    timed["data_s"] += data_s
                first = False
                epoch_losses.append(loss)
                report("step", step=step, loss=loss, seconds=seconds, data_seconds=data_s, epoch=epoch,
                       quiet_s=self.quiet_s())
                writer.add("loss", step, loss)
                writer.add("samples_per_second", step, self.batch / max(seconds + data_s, 1e-9))
                ended = step % per_epoch == 0
                if step % s["checkpoint_every"] == 0 or step == total or ended:
                    writer.flush()  # the logs reach at least as far as the checkpoint a resume goes on from
                    values = self.checkpoint(step, per_epoch)
                if ended or step == total:
                    self.end_epoch(epoch, step, epoch_losses, values, validation, writer, ended)
                    epoch_losses = []
                if step == total:
                    break
                waited = time.perf_counter()
        writer.flush()
        report("phase", what="writing model.keras", quiet_s=LONG_PHASE_S)
        self.export(values, data)
        steps, busy = timed["steps"], timed["step_s"] + timed["data_s"]
        report("done", steps=step, timed_steps=steps, samples_per_s=steps * self.batch / busy if busy else None,
               input_share=timed["data_s"] / busy if busy else None)
        return 0

    def latest(self) -> str | None:
        from .checkpoints import latest_checkpoint

        kept = latest_checkpoint(self.run_dir)
        return str(kept) if kept else None

    def checkpoint(self, step: int, per_epoch: int) -> list[np.ndarray]:
        from .checkpoints import write_checkpoint

        self.stage = f"checkpoint at step {step}"
        # Reading the copies waits on every task, as a step does: a lost task must end it as it ends a step.
        report("phase", what=f"reading the variables for the {self.stage}", quiet_s=self.quiet_s())
        start = time.perf_counter()
        values, difference = copy_values(self.distributed, self.meta, self.options())
        report("phase", what=f"writing the {self.stage}", quiet_s=LONG_PHASE_S)
        epoch, position = divmod(step, per_epoch)
        s = self.settings
        state = {"step": step, "epoch": epoch, "batches_done_in_epoch": position, "seed": s["seed"],
                 **s["identity"], "plan_id": s.get("plan_id"), "strategy": self.plan["strategy"].get("name")}
        path = write_checkpoint(self.run_dir, values, self.meta["variables"], state, s["keep"])
        report("checkpoint", step=step, path=str(path), seconds=time.perf_counter() - start,
               copy_difference=difference, quiet_s=self.quiet_s())
        return values

    def end_epoch(self, epoch: int, step: int, losses: list[float], values, validation, writer, whole: bool) -> None:
        fields: dict[str, Any] = {"epoch": epoch, "step": step, "whole": whole,
                                  "train_loss": float(np.mean(losses)) if losses else None}
        if validation is not None:
            self.stage = f"validation after step {step}"
            report("phase", what=self.stage, quiet_s=LONG_PHASE_S)
            self.keras.assign(self.names, values)
            metrics = self.keras.evaluate(validation.in_order(self.batch))
            fields["validation"] = metrics
            for name, value in metrics.items():
                writer.add(f"validation/{name}", step, value)
        writer.flush()
        report("epoch", **fields, quiet_s=self.quiet_s())

    def export(self, values: list[np.ndarray], data) -> None:
        """RUN_DIR/model.keras, loaded back and checked: on one batch its loss equals the emitted step's forward
        pass (the loss fetched without the update)."""
        import keras

        self.stage = "writing model.keras"
        self.keras.assign(self.names, values)
        path = self.keras.save(self.run_dir / "model.keras")
        batch = next(iter(data.batches(self.settings["seed"], 0, self.batch)))
        report("phase", what="the emitted step's forward pass, for the check of model.keras", quiet_s=self.quiet_s())
        emitted = float(self.distributed.session.run(
            self.meta["loss_tensor"], feed_dict=dict(zip(self.meta["input_tensors"], batch)), options=self.options()))
        loaded = keras.models.load_model(path, compile=False)
        ours = self.keras.loss_on(batch, loaded)
        report("model", path=str(path), emitted_loss=emitted, keras_loss=ours,
               relative_difference=abs(ours - emitted) / max(abs(emitted), 1e-12))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tag_core.train.trainer")
    parser.add_argument("settings", help="RUN_DIR/run.json as `tag train` wrote it")
    add_task_arguments(parser)
    parser.add_argument("--direct", action="store_true",
                        help="no servers: the step in this process's own session (tag_core.runtime.direct)")
    args = parser.parse_args(argv)
    exit_with_parent()
    if args.direct:  # before TensorFlow starts a thread: every one it starts inherits the core
        from tag_core.profile.timing import pin
        from tag_core.runtime.local_cluster import pinnable_cores

        pin(pinnable_cores()[:1], 1)
    settings = json.loads(Path(args.settings).read_text())
    from tag_core.errors import TagInputError

    try:
        return Run(settings, args).main()
    except FolderError as exc:
        report("input_error", where="DIR", message=str(exc))
        return 2
    except TagInputError as exc:
        report("input_error", where=exc.where, message=exc.problem)
        return 2


if __name__ == "__main__":
    sys.exit(main())
