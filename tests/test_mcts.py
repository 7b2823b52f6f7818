"""MCTS and MCMC on small hand-built graphs: action space, caching, determinism, priors,
out-of-memory handling and warm starts. Every score comes from the real simulator."""

from __future__ import annotations

import numpy as np
import pytest
from simgraphs import profiles, topology, train_graph

from tag_core.cluster import GpuType, load_topology
from tag_core.search import (
    ActionSpace,
    Budget,
    Evaluator,
    Mcts,
    OpGroups,
    SearchState,
    check_prior,
    decision_order,
    device_speed,
    group_ops,
    mcmc_search,
    reward,
)
from tag_core.simulate import OPTIONS, Simulator


def _setup(layers: int = 6, groups: int = 6, topo=None):
    g = train_graph(layers=layers)
    topo = topo or topology(("fast", "V100-32GB", 2, 100.0), ("slow1", "T4", 2, 50.0), ("slow2", "T4", 2, 50.0),
                            ("old", "GTX1080Ti", 1, 50.0), inter_gbps=10.0)
    sim = Simulator(g, topo, profiles(g, "cpu", per_sample_us=100.0, constant_us=20.0))
    grp = group_ops(g, sim.ref_time * 1e6, groups, seed=0)
    speed = device_speed(sim)
    space = ActionSpace.build(sim, speed)
    return sim, grp, space, Evaluator(sim, grp, space, speed / speed.sum(), speed=speed)


def _search(seed: int = 0, iterations: int = 40, prior=None):
    sim, grp, space, ev = _setup()
    dp = ev.score(np.full(grp.num_groups, space.all_machines)).time_s
    mcts = Mcts(ev, dp, dp, seed=seed, prior=prior)
    return mcts, mcts.run(Budget(iterations=iterations)), ev


def test_action_space_masks_are_distinct_and_cover_the_documented_kinds():
    sim, _, space, _ = _setup()
    assert space.size == len(space.masks) * len(OPTIONS)
    assert len({m.tobytes() for m in space.masks}) == len(space.masks)
    assert space.masks[0].all() and space.mask_names[0] == "all"
    names = set(space.mask_names)
    assert {"fast", "slow1", "slow2", "old", "all-T4", "top2", "top3"} <= names
    # all-V100-32GB is the single machine "fast": kept once, under its first name.
    assert "all-V100-32GB" not in names
    # top2 = the two machines with the most summed device speed: the V100s, then the first T4 pair.
    top2 = space.masks[space.mask_names.index("top2")]
    assert top2.tolist() == [True, True, False, False]
    assert len(space.masks) == 1 + 4 + 1 + 2  # all, singles, all-T4, top2..top3
    a = space.index(np.array([True, False, False, True]), "ps")
    assert space.option(a) == "ps" and space.mask(a).tolist() == [True, False, False, True]  # appended on demand
    assert len(space.masks) == 9


@pytest.mark.parametrize("name,masks", [("testbed", 15), ("cloud", 12)])
def test_action_space_size_on_example_topologies(name: str, masks: int):
    g = train_graph(layers=1)
    sim = Simulator(g, load_topology(f"examples/topologies/{name}.json"), profiles(g, "cpu"))
    space = ActionSpace.build(sim, device_speed(sim))
    assert len(space.masks) == masks


def test_search_is_deterministic_for_a_seed_and_returns_the_best_seen():
    a, ra, ev = _search(seed=3)
    b, rb, _ = _search(seed=3)
    assert np.array_equal(ra.actions, rb.actions) and ra.time_s == rb.time_s and ra.trace == rb.trace
    # The best plan is the best feasible score in the cache, and its score is what the simulator says.
    feasible = [s.time_s for s in ev.cache.values() if not s.oom]
    assert ra.time_s == min(feasible)
    assert ev.sim.run(ev.strategy(ra.actions)).iteration_time_s == pytest.approx(ra.time_s)
    # Every new best is strictly better than the one before.
    times = [t for _, _, t in ra.trace]
    assert times == sorted(times, reverse=True) and len(set(times)) == len(times)


def test_simulations_are_cached_by_strategy():
    mcts, result, ev = _search(iterations=60)
    assert result.iterations == 60
    assert result.simulations == ev.simulations == len(ev.cache) <= 60
    before = ev.simulations
    some = np.frombuffer(next(iter(ev.cache)), dtype=np.int64)
    ev.score(some)
    assert ev.simulations == before


def test_search_beats_dp_on_a_slow_network_and_records_when():
    mcts, result, ev = _search(iterations=60)
    dp = mcts.best.dp
    assert result.time_s < dp
    assert result.first_better_than_dp_iteration is not None
    assert 1 <= result.first_better_than_dp_iteration <= result.iterations
    assert result.best_at(result.simulations) == result.time_s


def test_prior_hook_sees_the_state_and_steers_the_root():
    seen: list[SearchState] = []
    _, grp, space, _ = _setup()
    favourite = space.index(space.masks[space.mask_names.index("fast")], "allreduce")

    def prior(state: SearchState) -> np.ndarray:
        seen.append(state)
        p = np.full(space.size, 1e-3)
        p[favourite] = 1.0
        return p

    mcts, _, _ = _search(iterations=30, prior=prior)
    assert seen[0].depth == 0 and seen[0].decided == () and seen[0].group == 0
    deeper = [s for s in seen if s.depth > 0]
    assert deeper and all(len(s.decided) == s.depth for s in deeper)
    assert all(s.actions.shape == (grp.num_groups,) for s in seen)
    assert seen[-1].sim_result().iteration_time_s > 0
    visits = mcts.visit_counts()
    assert visits.argmax() == favourite and visits.sum() == 30


def test_a_light_group_with_the_gradients_is_decided_early():
    """The weight gradients take little compute but carry every synchronised byte: the tree decides
    them before a group with more compute and no gradient, and the prior hook is told so."""
    sim, _, space, _ = _setup(layers=3)
    kind = np.array([0 if op.type == "MatMul" and op.batch_scaled else 2 if op.name.startswith("gw") else 1
                     for op in sim.graph.ops])
    time_us = np.bincount(kind, weights=sim.ref_time * 1e6)
    assert time_us[0] > time_us[1] > time_us[2]  # index order is compute order
    groups = OpGroups(assignment=kind, group_time_us=time_us, seed=0)
    speed = device_speed(sim)
    ev = Evaluator(sim, groups, space, speed / speed.sum(), speed=speed)
    assert decision_order(ev).tolist() == [2, 0, 1]
    seen: list[SearchState] = []

    def prior(state: SearchState) -> np.ndarray:
        seen.append(state)
        return np.ones(space.size)

    dp = ev.score(np.full(3, space.all_machines)).time_s
    Mcts(ev, dp, dp, prior=prior).run(Budget(iterations=2 * space.size))
    assert seen[0].group == 2 and seen[0].decided_groups == ()
    assert {(s.group, s.decided_groups) for s in seen if s.depth == 1} == {(0, (2,))}


def test_bad_prior_output_is_refused():
    with pytest.raises(ValueError, match="shape"):
        check_prior(np.ones(3), 4)
    with pytest.raises(ValueError, match="non-negative"):
        check_prior(np.array([1.0, -1.0, 0.5, 0.5]), 4)
    with pytest.raises(ValueError, match="finite"):
        check_prior(np.array([np.nan, 1, 1, 1]), 4)
    assert check_prior([1, 1, 2, 0], 4).tolist() == [0.25, 0.25, 0.5, 0.0]
    with pytest.raises(ValueError, match="shape"):
        _search(iterations=2, prior=lambda state: np.ones(2))


def test_reward_is_relative_to_the_baseline_and_minus_one_on_oom():
    from tag_core.search import Score

    assert reward(Score(0.5, False), 1.0) == pytest.approx(1.0)
    assert reward(Score(2.0, False), 1.0) == pytest.approx(-0.5)
    assert reward(Score(0.1, True), 1.0) == -1.0


def test_budget_in_seconds_ends_the_search():
    sim, grp, space, ev = _setup()
    mcts = Mcts(ev, 1.0, 1.0, seed=0)
    result = mcts.run(Budget(seconds=0.3))  # no iteration cap: only the clock can end it (pytest-timeout guards)
    assert result.iterations >= 1 and result.simulations >= 1


def test_warm_start_seeds_the_incumbent():
    sim, grp, space, ev = _setup()
    dp = ev.score(np.full(grp.num_groups, space.all_machines)).time_s
    cold = Mcts(ev, dp, dp, seed=1).run(Budget(iterations=40))
    ev2 = Evaluator(sim, grp, space, ev.shares)
    warm = Mcts(ev2, dp, dp, seed=1)
    warm.seed_path(cold.actions)
    assert warm.best.score.time_s == cold.time_s and warm.iterations == 1
    result = warm.run(Budget(iterations=5))
    assert result.time_s <= cold.time_s
    assert result.trace[0] == (1, 1, cold.time_s)


def test_mcmc_is_deterministic_respects_its_budget_and_starts_from_the_start():
    sim, grp, space, ev = _setup()
    start = np.full(grp.num_groups, space.all_machines)
    first = mcmc_search(ev, start, Budget(simulations=25), dp_time_s=1.0, seed=5)
    again = mcmc_search(Evaluator(sim, grp, space, ev.shares), start, Budget(simulations=25), 1.0, seed=5)
    assert np.array_equal(first.actions, again.actions) and first.trace == again.trace
    assert first.simulations == 25 and first.iterations >= 25
    assert first.trace[0] == (1, 1, ev.score(start).time_s)
    assert first.time_s == min(s.time_s for s in ev.cache.values() if not s.oom)


def _tiny_gpu(mem_gb: float) -> GpuType:
    return GpuType("tiny", tflops=10.0, mem_gb=mem_gb, mem_bw_gbps=500.0)


def test_oom_plans_score_minus_one_and_are_never_the_answer_when_a_fitting_plan_exists():
    # 6 layers of 4 MB weights + Adam: a replica holds ~72 MB of variables; 40 MB devices cannot
    # hold a replica, but model parallelism over 4 of them can.
    topo = topology(("a", _tiny_gpu(0.04), 2, 100.0), ("b", _tiny_gpu(0.04), 2, 100.0), inter_gbps=10.0)
    sim, grp, space, ev = _setup(topo=topo, groups=2)  # 16 ops a group: enough to split over 4 devices
    replicated = ev.score(np.full(grp.num_groups, space.all_machines))
    assert replicated.oom
    mp = space.all_machines + OPTIONS.index("model_parallel")
    assert not ev.score(np.full(grp.num_groups, mp)).oom
    split = ev.strategy(np.full(grp.num_groups, mp))
    assert len(set(split.op_devices.tolist())) == 4  # METIS spread the ops over every device
    for v in {op.variable for op in sim.graph.ops if op.variable}:  # a variable's ops stay together
        assert len({int(split.op_devices[i]) for i, op in enumerate(sim.graph.ops) if op.variable == v}) == 1
    from tag_core.search import MctsConfig

    mcts = Mcts(ev, 1.0, 1.0, seed=0, config=MctsConfig(default=mp))
    result = mcts.run(Budget(iterations=20))
    assert not result.oom and np.isfinite(result.time_s)


def test_groups_sharing_an_action_become_one_strategy_group():
    from tag_core.search import baseline
    from tag_core.search.baselines import HOROVOD_FUSION_BYTES

    sim, grp, space, _ = _setup()
    ev = Evaluator(sim, grp, space, np.ones(sim.num_devices), fusion_bytes=HOROVOD_FUSION_BYTES, overlap=True)
    uniform = ev.strategy(np.full(grp.num_groups, space.all_machines))
    assert uniform.num_groups == 1 and not uniform.op_groups.any()
    # The same plan as Horovod's, so the same simulated time: fusion buckets span the op groups.
    assert sim.run(uniform).iteration_time_s == pytest.approx(sim.run(baseline("horovod", sim)).iteration_time_s)
    ps = space.all_machines + OPTIONS.index("ps")
    actions = np.full(grp.num_groups, space.all_machines)
    actions[1::2] = ps
    mixed = ev.strategy(actions)
    assert mixed.num_groups == 2
    for op, g in enumerate(grp.assignment):
        assert mixed.options[mixed.op_groups[op]] == ("ps" if g % 2 else "allreduce")


def test_results_for_prior_hooks_have_one_row_per_op_group():
    sim, grp, space, ev = _setup()
    actions = np.full(grp.num_groups, space.all_machines)  # one strategy group...
    result = ev.result(actions)
    assert result.group_makespan_s.shape == result.group_idle_after_s.shape == (grp.num_groups,)  # ...six rows
    for g in range(grp.num_groups):
        ops = grp.members(g)
        assert result.group_makespan_s[g] == pytest.approx(result.op_end_s[ops].max() - result.op_start_s[ops].min())
        assert result.group_idle_after_s[g] == pytest.approx(result.op_idle_after_s[ops].sum())


def test_best_uniform_is_the_fastest_scored_plan_with_one_action_everywhere():
    sim, grp, space, ev = _setup()
    G = grp.num_groups
    assert ev.best_uniform() is None
    uniform = {a: ev.score(np.full(G, a)).time_s for a in range(0, space.size, 3)}
    mixed = np.arange(G) % space.size
    ev.score(mixed)  # a mixed plan is no candidate, however fast
    fastest = min(uniform, key=lambda a: (ev.score(np.full(G, a)).oom, uniform[a]))
    assert ev.best_uniform().tolist() == [fastest] * G
