"""Search problems for training and benchmarks: (model, topology, settings) -> an MCTS ready to run.

Two settings:
  "planner"  what `tag plan` searches: strategy-wide settings (batch shares, gradient
             fusion, overlap) picked as planner.plan does, out-of-memory mode included;
  "dp"       the strategy space only: equal batch shares, no fusion, no overlap, so the
             all-machines AllReduce default *is* DP-NCCL and every gain over it must come
             from the per-group (mask, option) choices. The TAG paper's Table VII counts
             MCTS iterations to beat DP-NCCL in this space; under "planner" settings the
             default plan alone usually beats DP-NCCL at iteration 1.
Training topologies come from seeds [0, n); benchmarks use seeds from BENCHMARK_SEED_BASE.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tag_core.capture.graph import OpGraph
from tag_core.cluster.topology import Topology
from tag_core.plan.planner import (  # _settings: the planner's own choice, reused so training matches it
    _settings,
    make_groups,
)
from tag_core.search.baselines import device_speed, run_baselines
from tag_core.search.grouping import DEFAULT_GROUPS, OpGroups
from tag_core.search.mcts import ActionSpace, Evaluator, Mcts, MctsConfig, Prior
from tag_core.simulate.simulator import Simulator

SETTINGS = ("dp", "planner")
BENCHMARK_SEED_BASE = 1_000_000  # random_topology seeds at or above this are never trained on


@dataclass
class ModelSource:
    """A captured model ready to plan: graph, profiles (None: roofline estimates) and METIS groups."""

    name: str
    graph: OpGraph
    profiles: pd.DataFrame | None
    groups: OpGroups

    @classmethod
    def build(cls, name: str, graph: OpGraph, profiles: pd.DataFrame | None,
              num_groups: int = DEFAULT_GROUPS) -> "ModelSource":
        profiles = profiles if profiles is not None and len(profiles) else None
        return cls(name, graph, profiles, make_groups(graph, profiles, num_groups))


@dataclass
class Problem:
    evaluator: Evaluator
    baseline_s: float  # reward baseline (DP-NCCL, or the feasible default when DP-NCCL runs out of memory)
    dp_time_s: float
    dp_oom: bool
    config: MctsConfig
    settings: str

    def search(self, seed: int, prior: Prior | None = None) -> Mcts:
        return Mcts(self.evaluator, self.baseline_s, self.dp_time_s, seed=seed, prior=prior, config=self.config)


def build_problem(source: ModelSource, topology: Topology, settings: str = "planner") -> Problem:
    """Raises TagInputError when the model fits no device set of `topology`."""
    if settings not in SETTINGS:
        raise ValueError(f"settings must be one of {SETTINGS}, got {settings!r}")
    sim = Simulator(source.graph, topology, source.profiles)
    dp = run_baselines(sim, ("dp-nccl",))["dp-nccl"][1]
    speed = device_speed(sim)
    space = ActionSpace.build(sim, speed)
    G = source.groups.num_groups
    if settings == "dp" and not dp.oom:
        ev = Evaluator(sim, source.groups, space, np.ones(sim.num_devices), fusion_bytes=0, overlap=False, speed=speed)
        return Problem(ev, float(dp.iteration_time_s), float(dp.iteration_time_s), False, MctsConfig(), settings)
    ev, _, default, _ = _settings(sim, source.groups, space, speed)
    baseline = dp.iteration_time_s if not dp.oom else ev.score(np.full(G, default)).time_s
    config = MctsConfig(default=-1 if default == space.all_machines else default)
    return Problem(ev, float(baseline), float(dp.iteration_time_s), bool(dp.oom), config, "planner")
