"""Import a user's model file and call its function in a process of its own (`load_child.py`), under the
model timeout.

A thread other than the main one cannot interrupt code (time_limit.py): there `resolve_model` runs this
check first, and kills the child when even its own limits did not stop it (a hang in C code).
"""

from __future__ import annotations

import subprocess
import sys

from tag_core import tf_children
from tag_core.errors import TagInputError

# Beyond the child's own limits (importing, then calling): its interpreter's and TAG's start-up.
CHILD_START_S = 60.0


def child_error(stderr: str) -> TagInputError | None:
    """The last `tag: error: WHERE: PROBLEM` line a child TAG process printed, as the error it was."""
    lines = [line for line in stderr.splitlines() if line.startswith("tag: error: ")]
    if not lines:
        return None
    where, _, problem = lines[-1].removeprefix("tag: error: ").partition(": ")
    return TagInputError(where, problem)


def run_model_child(command: list[str], doing: str, backstop: float, timeout: float,
                    env: dict[str, str] | None = None) -> None:
    """Run a child that runs model code under its own limits; its `tag: error:` comes back as the
    TagInputError it was, a hang its limits could not cut is killed at `backstop` seconds."""
    try:
        result = tf_children.run(command, env=env, timeout=backstop)
    except subprocess.TimeoutExpired:  # run() killed it
        raise TagInputError("model", f"{doing} in a child process did not finish within "
                                     f"{backstop:g} s (model timeout {timeout:g} s)") from None
    if result.returncode != 0:
        error = child_error(result.stderr)
        if error is not None:
            raise error
        raise RuntimeError(f"{doing} in a child process failed (exit {result.returncode}):\n{result.stderr[-3000:]}")


def load_in_child(reference: str, seconds: float) -> None:
    """Raise the TagInputError loading `reference` gives, timeouts included, from a child process."""
    from .time_limit import LONGEST_S

    backstop = min(2 * seconds + CHILD_START_S, LONGEST_S)
    run_model_child([sys.executable, "-m", "tag_core.capture.load_child", reference, repr(seconds)],
                    f"loading {reference}", backstop, seconds)
