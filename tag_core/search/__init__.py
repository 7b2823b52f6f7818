"""The search for a strategy: op groups, the action space, MCTS, MCMC and the baselines.

In: an `OpGraph` with profiles, and a `Simulator` (`tag_core.simulate`) to score candidates.
Out: `OpGroups` (METIS groups of ops), the baselines' strategies (DP-NCCL, DP-NCCL-P, Horovod,
single device), and the best `Strategy` MCTS or MCMC found within a `Budget`.
"""

from .baselines import BASELINES, baseline, baseline_name, device_speed, run_baselines
from .grouping import DEFAULT_GROUPS, OpGroups, group_ops
from .mcmc import mcmc_search
from .mcts import Budget, Mcts, MctsConfig, SearchResult, SearchState, check_prior, decision_order
from .space import ActionSpace, Evaluator, Score, reward
from .strategy_files import load_strategy, read_plan_file

__all__ = [
    "ActionSpace", "BASELINES", "Budget", "DEFAULT_GROUPS", "Evaluator", "Mcts", "MctsConfig", "OpGroups",
    "Score", "SearchResult", "SearchState", "baseline", "baseline_name", "check_prior", "decision_order",
    "device_speed", "group_ops", "load_strategy", "mcmc_search", "read_plan_file", "reward", "run_baselines",
]
