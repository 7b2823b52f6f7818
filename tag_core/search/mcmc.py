"""FlexFlow-style MCMC baseline over the same strategy space and simulator as MCTS.

From a starting plan, each step proposes a random single-group mutation (one group,
a uniformly drawn different action) and accepts it by the Metropolis rule on the
simulated time, made scale-free:

    accept with probability min(1, exp(-beta * (t_new - t_cur) / t_cur))

so with the default beta = 20 a 5 % slower plan is accepted about a third of the
time. An out-of-memory proposal is rejected unless the current plan is out of memory
too (then any proposal is taken: a random walk until something fits). The budget
counts distinct simulated strategies (cache hits are free, as for MCTS); proposals
are capped at `PROPOSALS_PER_SIMULATION` times that so a converged chain still ends.
The best plan seen is returned.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np

from .mcts import Budget, Evaluator, SearchResult, _Best

DEFAULT_BETA = 20.0
PROPOSALS_PER_SIMULATION = 50


def mcmc_search(evaluator: Evaluator, start: np.ndarray, budget: Budget, dp_time_s: float, seed: int = 0,
                beta: float = DEFAULT_BETA,
                progress: Callable[[int, SearchResult], None] | None = None) -> SearchResult:
    """Metropolis search from `start` (an action per group); `iterations` counts proposals."""
    rng = np.random.default_rng(seed)
    G, K = evaluator.groups.num_groups, evaluator.space.size
    current = np.asarray(start, dtype=np.int64).copy()
    best = _Best(dp_time_s)
    clock = time.perf_counter()
    cur = evaluator.score(current)
    proposals = 1
    best.offer(current, cur, proposals, evaluator.simulations)
    cap = None if budget.simulations is None else budget.simulations * PROPOSALS_PER_SIMULATION
    while not budget.done(proposals, evaluator.simulations, time.perf_counter() - clock):
        if K < 2 or (cap is not None and proposals >= cap):
            break
        proposals += 1
        g = int(rng.integers(G))
        a = int(rng.integers(K - 1))
        proposal = current.copy()
        proposal[g] = a if a < current[g] else a + 1  # any action but the current one
        new = evaluator.score(proposal)
        best.offer(proposal, new, proposals, evaluator.simulations)
        if _accept(cur, new, beta, rng):
            current, cur = proposal, new
        if progress is not None:
            progress(proposals, best.result(proposals, evaluator.simulations, time.perf_counter() - clock))
    return best.result(proposals, evaluator.simulations, time.perf_counter() - clock)


def _accept(cur, new, beta: float, rng: np.random.Generator) -> bool:
    if cur.oom:
        return True
    if new.oom:
        return False
    if new.time_s <= cur.time_s:
        return True
    return bool(rng.random() < math.exp(-beta * (new.time_s - cur.time_s) / cur.time_s))
