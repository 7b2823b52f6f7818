"""Running an emitted graph on TF's distributed runtime, and checking it against one device.

In: an emission folder (`tag_core.emit`), a number of steps, optionally a real cluster's spec.
Out: a `RunResult`: step times and, with `check`, the loss and every variable compared with the
single-device step. The servers run in a child process (`worker`) that ends with the run.
"""

from .supervisor import RunResult, describe, run_emitted

__all__ = [
    "RunResult", "describe", "run_emitted",
]
