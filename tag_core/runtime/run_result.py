"""`RunResult`, what a run of an emitted step returns, and the lines its worker's events make (`describe`)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

SHOWN_COLLECTIVES = 6
LOOPBACK_WHERE = "reachable on loopback only (a network namespace of their own, with only lo up)"


@dataclass
class RunResult:
    ok: bool
    steps: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    lines: list[str] = field(default_factory=list)  # what was reported, as printed
    reference: str | None = None  # what --check compared against
    check_skipped: str | None = None  # why --check compared nothing
    servers: str = "shared"  # where the tasks served: "pinned", "shared" or "cluster"
    server_pids: list[int] = field(default_factory=list)  # pinned: one process per task
    server_cores: list[int | None] = field(default_factory=list)  # pinned: the core of each

    @property
    def measured_steps(self) -> list[dict[str, Any]]:
        """The steps after the warm-up."""
        return [s for s in self.steps if not s.get("warmup")]

    @property
    def seconds_per_step(self) -> float | None:
        """Mean step time after the warm-up, else after the first (which includes TF's one-off graph setup)."""
        measured = self.measured_steps
        if len(measured) < len(self.steps):
            times = [s["seconds"] for s in measured]
        else:
            times = [s["seconds"] for s in self.steps[1:]] or [s["seconds"] for s in self.steps]
        return sum(times) / len(times) if times else None

    @property
    def reference_seconds_per_step(self) -> float | None:
        """The single-device step's mean time after the first (with --check)."""
        times = [s["reference_seconds"] for s in self.steps[1:] if "reference_seconds" in s]
        return sum(times) / len(times) if times else None

    @property
    def left_out_fraction(self) -> float | None:
        """The largest share of variable elements a step left out of the comparison (rounding noise)."""
        values = [s["left_out_fraction"] for s in self.steps if "left_out_fraction" in s]
        return max(values) if values else None

    @property
    def max_relative_difference(self) -> float | None:
        values = [s["max_relative_difference"] for s in self.steps if "max_relative_difference" in s]
        return max(values) if values else None


def describe(event: dict, result: RunResult) -> list[str]:
    """Human lines for one worker event (and the error, kept on `result`)."""
    kind = event["event"]
    if kind == "start":
        where = "this machine's local TF servers" if not event.get("gpu_as_cpu") else "local TF servers (GPU devices as CPU)"
        if event.get("pinned"):
            where = "pinned single-core local TF servers, one process per task" + \
                    (" (GPU devices as CPU)" if event.get("gpu_as_cpu") else "")
        elif event.get("loopback_only"):  # pinned servers: the line that started them said so
            where += f", {LOOPBACK_WHERE}"
        if event.get("warmup_seconds"):
            warmup = f"; {event['warmup']} or more warm-up steps first, until {event['warmup_seconds']:g} s have passed"
        else:
            warmup = f"; {event['warmup']} warm-up steps first" if event.get("warmup") else ""
        return [f"running {event['ops']} ops on {event['devices']} devices of {event['tasks']} tasks on {where}{warmup}"]
    if kind == "check":
        if event.get("skipped"):
            result.check_skipped = event["skipped"]
            return [f"check skipped: the model computes batch statistics per replica ({event['statistics']} ops) "
                    f"and {event['skipped']}; the steps run without comparison"]
        result.reference = event["reference"]
        lines = [f"checking each step against the {event['reference']}, from the same variables: after each "
                 f"comparison every copy restarts from the reference's values"]
        if event.get("statistics"):
            lines.append(f"  batch statistics are per replica ({event['statistics']} ops), as standard data "
                         f"parallelism does")
        return lines
    if kind == "serving":
        return [f"task {event['task']} serving at {event['target']} (process {event['pid']}; stop this command "
                f"when task 0 is done)"]
    if kind == "step":
        result.steps.append(event)
        warm = ", warm-up" if event.get("warmup") else ""
        line = f"step {event['step']}: loss {event['loss']:.6g} ({event['seconds'] * 1e3:.1f} ms{warm})"
        if "reference_loss" not in event:
            return [line]
        compared = event["compared"]
        verdict = "ok" if event["passed"] else "MISMATCH"
        lines = [f"{line}; reference loss {event['reference_loss']:.6g}; compared the loss and "
                 f"{compared['variables']} variables ({compared['copies']} copies): max relative difference "
                 f"{event['max_relative_difference']:.2e} at {event['worst']} [{verdict}]"]
        noise = event.get("noise_gradient_variables") or []
        partly = event.get("noise_elements") or {"variables": 0, "elements": 0}
        shown = {name for step in result.steps[:-1] for name in step.get("noise_gradient_variables") or []}
        if noise and set(noise) - shown:
            lines.append(f"  not compared: {len(noise)} variables whose reference gradient is rounding noise "
                         f"(under 1e-6 of the step's largest, or not reproduced when summed in another order; "
                         f"Adam scales it up): {', '.join(noise)}")
        if partly["elements"]:
            lines.append(f"  not compared: {partly['elements']} elements of {partly['variables']} variables whose "
                         f"gradient float32 does not determine (it moves by over 1e-5 when the batch is summed in "
                         f"another order); they restart from the reference's values each step")
        return lines
    if kind == "error":
        result.error = _error_message(event)
        return []
    if kind == "done":
        per_step = result.seconds_per_step
        after = f"the {event['warmup']} warm-up steps" if event.get("warmup") else "the first"
        timing = f", {per_step * 1e3:.1f} ms per step after {after}" if per_step is not None else ""
        failed = f"; {event['failed_steps']} steps differ from the single-device step by more than 1e-4" \
            if event.get("failed_steps") else ""
        return [f"ran {event['steps']} steps{timing}{failed}"]
    return []


def _error_message(event: dict) -> str:
    message = f"{event['stage']} failed: {event['kind']}: {event['message']}"
    waiting = event.get("waiting") or []
    if waiting:
        message += "\n" + "\n".join(
            f"  waiting: collective {c['node']} on {c['device']} (all-reduce of {c['tensor']}, group "
            f"{c['group_key']} of {len(c['group'])} devices: {', '.join(c['group'])})" for c in waiting)
    return message


def hang_message(stage: str, timeout: float, meta: dict) -> str:
    collectives = meta.get("collectives", [])
    message = f"{stage} did not finish within the {timeout:g} s timeout; the run was stopped"
    if collectives:
        shown = collectives[:SHOWN_COLLECTIVES]
        message += "; collectives of the step, any of which may be waiting for a peer:\n" + "\n".join(
            f"  {c['node']} on {c['device']} (group of {len(c['group'])}: {', '.join(c['group'])})" for c in shown)
        if len(collectives) > len(shown):
            message += f"\n  ... and {len(collectives) - len(shown)} more"
    return message


def failure_message(stderr_tail: deque) -> str:
    detail = "\n".join(line for line in stderr_tail if line and line.strip())[-3000:]
    return f"the run failed:\n{detail}"


NOTICES = ("oneDNN", "absl::InitializeLog")  # TF's start-up notices, which say nothing of a failure


def one_line_tail(stderr_tail, last: int | None = None, limit: int = 600) -> str:
    """A child's `last` stderr lines (all: None) as one line of at most `limit` characters; the pump's closing
    None and TF's start-up notices left out."""
    useful = [x for x in stderr_tail if x and x.strip() and not any(n in x for n in NOTICES)]
    return " | ".join(useful[-last:] if last else useful)[-limit:] or "no output"
