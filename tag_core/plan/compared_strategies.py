"""The strategies `tag fidelity` compares: a name `tag simulate` knows, METIS groups mixing the options
("mixed"), or a fresh TAG plan ("tag")."""

from __future__ import annotations

MIXED_GROUPS = 8


def build_strategy(name: str, sim, profiles, budget_iterations: int, measured_error=None):
    """The strategy `name` on the simulator's graph and topology (see `tag fidelity --strategies`); the TAG
    plan weighs `measured_error` (tag_core.plan.measured_error)."""
    from tag_core.search.strategy_files import load_strategy

    if name == "mixed":
        return mixed_strategy(sim, profiles)
    if name == "tag":
        from tag_core.search.mcts import Budget

        from .planner import plan

        planned = plan(sim.graph, sim.topology, profiles, batch_size=sim.batch,
                       budget=Budget(iterations=budget_iterations), comm=sim.comm, sfb=False,
                       measured_error=measured_error)  # no SFB: the emitter builds none
        strategy = planned.strategy
        strategy.name = "tag"
        return strategy
    return load_strategy(name, sim)


def mixed_strategy(sim, profiles):
    """METIS groups taking the four options in turn, on every machine, the first or the last."""
    import numpy as np

    from tag_core.simulate.strategy import OPTIONS, Strategy

    from .planner import make_groups

    groups = make_groups(sim.graph, profiles, MIXED_GROUPS)
    machines = sim.topology.num_machines
    masks = [np.ones(machines, dtype=bool), np.eye(machines, dtype=bool)[0], np.eye(machines, dtype=bool)[-1]]
    options = [OPTIONS[g % len(OPTIONS)] for g in range(groups.num_groups)]
    chosen = [masks[(g // len(OPTIONS) + g) % len(masks)] for g in range(groups.num_groups)]
    return Strategy(groups.assignment, np.array(chosen, dtype=bool), options, np.ones(sim.num_devices), name="mixed")
