"""Running an emitted graph on TF's distributed runtime, checking it against one device, and measuring
the runtime itself.

In: an emission folder (`tag_core.emit`), a number of steps, optionally a real cluster's spec; for
calibration, a number of local tasks or a real cluster's spec and topology.
Out: a `RunResult`: step times and, with `check`, the loss and every variable compared with the
single-device step. The servers run in a child process (`worker`) that ends with the run.
`local_cluster` starts pinned single-core TF servers in processes of their own; `calibrate` measures
a cluster's transfers, collectives and fixed costs into a `tag_core.cluster.calibration.Calibration`;
`fidelity` predicts, emits and measures several strategies side by side (`tag fidelity`).
"""

from .run_result import RunResult, describe
from .supervisor import run_emitted

__all__ = [
    "RunResult", "describe", "run_emitted",
]
