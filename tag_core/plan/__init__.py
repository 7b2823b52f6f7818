"""The planner: every search step in one call, and the plan JSON.

In: an `OpGraph`, a `Topology`, profiles, a search budget, optionally op groups, a GNN prior, a
warm-start plan and a fusion plan.
Out: a `Plan`: TAG's strategy (MCTS, then SFB) with its simulated time beside DP-NCCL, DP-NCCL-P,
Horovod, MCMC and the ideal bound, and the lineage that made it.
"""

from .comparison import comparison_rows, markdown_table
from .planner import (
    BASELINE_NAMES,
    DEFAULT_ITERATIONS,
    Plan,
    code_version,
    ideal_time_s,
    make_groups,
    plan,
    profile_batch_sizes,
)
from .warm_start import warm_start_actions, warm_start_problem

__all__ = [
    "BASELINE_NAMES", "DEFAULT_ITERATIONS", "Plan", "code_version", "comparison_rows", "ideal_time_s",
    "make_groups", "markdown_table", "plan", "profile_batch_sizes", "warm_start_actions",
    "warm_start_problem",
]
