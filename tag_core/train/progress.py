"""What `tag train` shows while the trainer works: a bar over the steps (step, loss, samples/s, ETA), a line
per epoch with its validation metrics, and what the trainer reported, kept for the run's record."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from tag_core.runtime.run_result import RunResult, describe


@dataclass
class TrainingEvents:
    """Everything the trainer reported, by kind."""

    start: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)
    model: dict[str, Any] | None = None
    done: dict[str, Any] | None = None
    nonfinite: dict[str, Any] | None = None


def _metrics(values: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.4g}" for name, value in values.items())


class TrainingProgress:
    """The supervisor's event handler for the trainer (tag_core.runtime.supervisor.run_child's `handle`)."""

    def __init__(self, show_bar: bool, batch: int):
        self.events = TrainingEvents()
        self.show_bar = show_bar
        self.batch = batch
        self.bar = None

    def __call__(self, event: dict[str, Any], result: RunResult) -> list[str]:
        kind = event["event"]
        handler: Callable | None = getattr(self, f"_on_{kind}", None)
        return handler(event, result) if handler else describe(event, result)

    def _on_start(self, event, result) -> list[str]:
        self.events.start = event
        dropped = event["dropped"]
        lines = [f"training on {event['devices']} devices of {event['tasks']} tasks ({event['ops']:,} ops): "
                 f"{event['rows']:,} rows, global batch {event['batch']}, {event['steps_per_epoch']} steps an epoch"
                 + (f" ({dropped} rows of the last partial batch dropped each epoch)" if dropped else "")]
        if event.get("resumed_from"):
            lines.append(f"resumed from {event['resumed_from']} at step {event['first_step']}")
        if self.show_bar and event["steps"] > event["first_step"]:
            from tqdm import tqdm

            self.bar = tqdm(total=event["steps"], initial=event["first_step"], unit="step", desc="train",
                            mininterval=0.25, file=sys.stderr, dynamic_ncols=True)
        return lines

    def _on_step(self, event, result) -> list[str]:
        self.events.steps.append(event)
        result.steps.append(event)
        if self.bar is not None:
            rate = self.batch / max(event["seconds"] + event["data_seconds"], 1e-9)
            self.bar.set_postfix_str(f"loss {event['loss']:.4g}, {rate:,.0f} samples/s", refresh=False)
            self.bar.update(1)
        return []

    def _on_checkpoint(self, event, result) -> list[str]:
        self.events.checkpoints.append(event)
        return []

    def _on_epoch(self, event, result) -> list[str]:
        self.events.epochs.append(event)
        what = f"epoch {event['epoch'] + 1}" if event["whole"] else f"epoch {event['epoch'] + 1} (partly)"
        line = f"{what}, step {event['step']}: train loss {event['train_loss']:.4g}"
        if event.get("validation"):
            line += f"; validation {_metrics(event['validation'])}"
        return [line]

    def _on_model(self, event, result) -> list[str]:
        self.events.model = event
        return [f"wrote {event['path']}: its loss on a batch {event['keras_loss']:.6g}, the emitted "
                         f"step's {event['emitted_loss']:.6g} (relative difference {event['relative_difference']:.1e})"]

    def _on_nonfinite(self, event, result) -> list[str]:
        self.events.nonfinite = event
        kept = event.get("checkpoint") or "none was written"
        what = f"the loss is {event['loss']}" if "loss" in event else f"variable {event['variable']} holds NaN or Inf"
        result.error = f"step {event['step']}: {what}; training stopped. The last good checkpoint: {kept}"
        return []

    def _on_done(self, event, result) -> list[str]:
        self.events.done = event
        self.close()
        if not event["timed_steps"]:
            return [f"nothing to train: the run stands at step {event['steps']}"]
        return [f"trained to step {event['steps']}: {event['samples_per_s']:,.0f} samples/s after the first step, "
                f"the input pipeline {event['input_share']:.1%} of it"]

    def _on_error(self, event, result) -> list[str]:
        self.close()
        return describe(event, result)

    def echo(self, line: str) -> None:
        """Print a line above the bar while it shows."""
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
