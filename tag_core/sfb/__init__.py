"""Sufficient Factor Broadcasting: which synchronised gradients to rebuild from their factors.

In: a `Simulator` and a `Strategy` (`tag_core.simulate`).
Out: an `SfbResult`: per gradient, a MILP's choice (pulp + CBC) of ops to run on the whole batch
and tensors to gather, and the strategy with those choices applied where the step gets faster.
"""

from .milp import DEFAULT_TIME_LIMIT_S, Decision, SfbResult, Subgraph, apply_sfb, decide, find_subgraphs

__all__ = [
    "DEFAULT_TIME_LIMIT_S", "Decision", "SfbResult", "Subgraph", "apply_sfb", "decide", "find_subgraphs",
]
