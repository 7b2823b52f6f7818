"""Kernel fusion of memory-intensive ops, in the FusionStitching manner, and XLA regions.

In: an `OpGraph` and its step GraphDef (`tag_core.capture`), a GPU type.
Out: a `FusionPlan` (patterns of fused ops, compiled regions, kernel counts), tuned by timing each
pattern for real; the step's GraphDef marked for XLA; a compute model that charges fused kernels.
`measure` (not imported here) times whole steps under each XLA mode in child processes.
"""

from .cost import FusedComputeModel
from .fuse import fuse_model
from .patterns import FusionPlan, classify, plan_fusion
from .region_calls import compile_as_calls
from .regions import compiled_regions, session_config
from .segment_sums import rewrite_as_gathers
from .step_check import check_step, step_fetches
from .tune import tune_plan
from .xla_marks import mark_emitted_for_xla, mark_for_xla

__all__ = [
    "FusedComputeModel", "FusionPlan", "fuse_model", "check_step", "classify", "compile_as_calls", "compiled_regions",
    "mark_emitted_for_xla", "mark_for_xla", "plan_fusion", "rewrite_as_gathers",
    "session_config", "step_fetches", "tune_plan",
]
