"""How a seconds budget bounds the whole of `plan`, not only the MCTS loop.

With `--budget-seconds S` the clock starts when planning starts (capture and profiles are
cached work and not counted). Set-up runs first (simulator, baselines, groups, settings);
from the time its simulations took, the work after the search is estimated (the final,
one-device and uncalibrated runs, the plan without SFB) and held back, with a share of the
budget for SFB's MILPs and trials (`SFB_SHARE`). MCTS gets most of
what is left; the estimate is then updated from the search's own simulations, which cost
more than the set-up's on large clusters, and the MCMC comparison gets what remains. SFB
then solves and tries, one trial at a time, while more than the final runs' time is left
(plan/sfb_step.py), and incumbents scored before the search (the best uniform plan) stop
where the held-back time begins. A set-up that overruns leaves the search no time, and the
plan is the best incumbent (the all-machines default at least). With an iterations budget
nothing is cut short.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from tag_core.search.mcts import Budget

SEARCH_SHARE = 0.75  # of the time after set-up and the held-back work; MCMC gets the rest
# Simulations after the search, besides SFB's share: the plan without SFB, a few trials, the final,
# one-device and uncalibrated runs.
SIMULATIONS_AFTER_SEARCH = 21
# Of those, the runs after SFB (final, one per GPU type and the one-device run, uncalibrated): SFB stops
# solving and trying when only their time is left.
FINAL_SIMULATIONS = 6
# Of a seconds budget, held back for SFB's MILPs and trials on its candidates (sfb_step.py). An
# estimate from the simulations alone left 0.6 s of 60 on 8192 GPUs, where simulations take 10 ms:
# the MILPs then ran, but not one trial, and vgg19's plan there (the default with factors broadcast,
# x2.04 over DP-NCCL) was never reached.
SFB_SHARE = 0.05


@dataclass
class Deadline:
    at: float | None  # time.perf_counter() when the budget runs out; None: an iterations budget
    seconds_per_simulation: float = 0.0  # as measured so far
    # The slowest simulation seen: a loop checks its clock before each simulation, so it may end this much late
    # (a PS plan over 200 machines of an 18k-op graph simulates in seconds where most take a tenth).
    slowest_s: float = 0.0
    sfb_s: float = 0.0  # held back for SFB

    @classmethod
    def starting_now(cls, budget: Budget, sfb: bool = True) -> Deadline:
        if budget.seconds is None:
            return cls(None)
        return cls(time.perf_counter() + budget.seconds, sfb_s=SFB_SHARE * budget.seconds if sfb else 0.0)

    def left_s(self) -> float:
        return math.inf if self.at is None else max(self.at - time.perf_counter(), 0.0)

    def passed(self) -> bool:
        return self.left_s() <= 0.0

    @property
    def reserve_s(self) -> float:
        # The plan chosen may be the slowest to simulate, and is simulated twice more (SFB's run without SFB,
        # the final run): at 8192 GPUs a 635-slot plan takes 7 s where the average is 1.2 s.
        return SIMULATIONS_AFTER_SEARCH * self.seconds_per_simulation + 2 * self.slowest_s + self.sfb_s

    def hold_back(self, seconds_per_simulation: float) -> None:
        """Keep time for the work after the search, at the measured cost of a simulation."""
        self.seconds_per_simulation = seconds_per_simulation

    def searching_allowed(self) -> bool:
        """Time is left beyond what the work after the search needs (incumbents scored before the search)."""
        return self.at is None or self.left_s() > self.reserve_s

    def sfb_time_left(self) -> bool:
        """SFB may solve another MILP: more than the final runs' time is left."""
        return self.at is None or self.left_s() > self._final_s

    def sfb_trial_fits(self, trial_s: float) -> bool:
        """SFB may run one more trial of `trial_s` seconds and still leave the final runs their time."""
        return self.at is None or self.left_s() > self._final_s + trial_s

    @property
    def _final_s(self) -> float:
        """The runs after SFB: the final one (of the chosen plan: the slowest, perhaps) and the cheap ones."""
        return FINAL_SIMULATIONS * self.seconds_per_simulation + self.slowest_s

    def search_budget(self, budget: Budget) -> Budget:
        if self.at is None:
            return budget
        return Budget(seconds=max(self.left_s() - self.reserve_s, 0.0) * SEARCH_SHARE)

    def mcmc_budget(self, simulations: int) -> Budget:
        """MCMC compares at the search's simulation count, within what the deadline leaves."""
        if self.at is None:
            return Budget(simulations=simulations)
        return Budget(simulations=simulations, seconds=max(self.left_s() - self.reserve_s - self.slowest_s, 0.0))
