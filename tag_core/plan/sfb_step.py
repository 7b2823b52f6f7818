"""Step 6 of `plan`: Sufficient Factor Broadcasting on the search's plan and a few others
(`sfb_plan_candidates`), inside the deadline.

`sfb.milp.decide` solves one MILP per synchronised gradient and `apply_sfb` simulates one trial per
gradient the MILPs chose: on 8192 GPUs that was minutes, after the budget had run out. Here the MILPs
are solved one at a time until the deadline leaves only the final runs' time, and each trial (the
largest estimated savings first) runs only while one more simulation as long as the plan's without SFB
still fits. The search's plan is always a candidate, so a plan past its deadline still reports SFB
(with the gradients it had time to decide).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

import numpy as np

from tag_core.search.grouping import OpGroups
from tag_core.search.mcts import Evaluator
from tag_core.sfb.milp import Decision, SfbResult, apply_sfb, decide
from tag_core.simulate.simulator import Simulator

from .deadline import Deadline


def sfb_plan_candidates(search: np.ndarray, ev: Evaluator, settings: dict, default: int,
                        setting_evaluators: list[tuple[dict, Evaluator]]) -> list[tuple]:
    """SFB's (actions, evaluator, settings, what it is) candidates, in the order the deadline takes them:
    - the search's plan;
    - the replicate-everything default under every setting (none in out-of-memory mode): with factors
      broadcast, plain data parallelism often wins, on thousands of GPUs too, where the deadline leaves SFB
      little time;
    - the best uniform plan the search scored: SFB can save more there, as the search's groups may already
      avoid syncing what SFB would broadcast (a PS for one large kernel);
    - last, the search's plan under the other strategy-wide settings, which were chosen before the search."""
    out = [(search, ev, settings, "search")]
    mode = settings.get("out_of_memory_mode", False)
    if not mode:
        full = np.full(len(search), default)
        out += [(full, e, {**s, "out_of_memory_mode": False}, "default") for s, e in setting_evaluators]
    uniform = ev.best_uniform()
    if uniform is not None and uniform[0] != default and not np.array_equal(uniform, search):
        out.append((uniform, ev, settings, "uniform"))
    others = [(s, e) for s, e in setting_evaluators if s != _without_oom_mode(settings)]
    out += [(search, e, {**s, "out_of_memory_mode": mode}, "search, other settings") for s, e in others]
    return out


def _without_oom_mode(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k != "out_of_memory_mode"}


def sfb_candidates(sim: Simulator, groups: OpGroups, candidates: Iterable[tuple[np.ndarray, Evaluator, dict, str]],
                   time_limit_s: float, deadline: Deadline) -> tuple[np.ndarray, dict, SfbResult, str]:
    """SFB on each (actions, evaluator, settings, what it is) candidate, the first always, the others while the
    deadline allows; returns the fastest as (actions, settings, SfbResult, what it is). Decisions depend only
    on placement, so they are solved once per distinct batch split."""
    solved: dict[bytes, list[Decision]] = {}
    best = None
    for actions, e, s, what in candidates:
        if best is not None and not deadline.sfb_time_left():
            break
        strategy = e.strategy(actions)
        key = replace(strategy, fusion_bytes=0, overlap=True).key()  # the placement alone
        if key not in solved:
            solved[key] = decide(sim, strategy, time_limit_s, keep_going=deadline.sfb_time_left)
        result = apply_sfb(sim, strategy, time_limit_s, decisions=solved[key], keep_going=deadline.sfb_trial_fits)
        if best is None or (result.oom, result.time_with_s) < (best[2].oom, best[2].time_with_s):
            best = (actions, s, result, what)
    return best

