"""What keeps `plan` inside its seconds budget on thousands of GPUs (issue 21), tested by what it does,
not by the clock: work before and after the search that does not grow with the machines, SFB and the
uniform-plan incumbent that stop at the deadline, and exact class-level shortcuts in the simulator."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from simgraphs import profiles, train_graph

from tag_core.cluster import Machine, Topology, lookup_gpu
from tag_core.plan import plan
from tag_core.plan.deadline import FINAL_SIMULATIONS, SFB_SHARE, Deadline
from tag_core.plan.planner import _best_uniform_plan, ideal_time_s
from tag_core.search import Budget
from tag_core.search.baselines import device_speed
from tag_core.search.grouping import OpGroups
from tag_core.search.space import MODEL_PARALLEL, ActionSpace, Evaluator
from tag_core.simulate import Simulator, Strategy, memory
from tag_core.simulate.cost import allgather_time, broadcast_time, hierarchical_allgather_time
from tag_core.simulate.simulator import Simulator as SimulatorClass
from tag_core.simulate.strategy import OPTIONS


def _cluster(machines_per_type: int) -> Topology:
    """Two classes of machines, `machines_per_type` of each (more than PER_MACHINE_UP_TO: class masks)."""
    specs = [(f"v{i}", "V100-32GB") for i in range(machines_per_type)] + \
            [(f"t{i}", "T4") for i in range(machines_per_type)]
    return Topology("c", tuple(Machine(n, lookup_gpu(g), 2, 100.0) for n, g in specs), inter_gbps=25.0)


def _problem():
    g = train_graph(layers=4)
    return g, profiles(g, "cpu", per_sample_us=100.0, constant_us=20.0)


def _counting_runs(monkeypatch) -> list[int]:
    calls: list[int] = []
    run = SimulatorClass.run

    def counted(self, strategy, timeline=False):
        calls.append(strategy.num_groups)
        return run(self, strategy, timeline)

    monkeypatch.setattr(SimulatorClass, "run", counted)
    return calls


def test_a_passed_deadline_simulates_as_often_on_ten_times_the_machines(monkeypatch):
    """Set-up and the work after the search simulate a fixed number of strategies (baselines, the first
    setting, the default, SFB's plan without SFB, the final and one-device runs), however many machines."""
    g, prof = _problem()
    counts, plans = [], []
    for per_type in (9, 90):
        calls = _counting_runs(monkeypatch)
        p = plan(g, _cluster(per_type), prof, num_groups=4, budget=Budget(seconds=1e-9))
        monkeypatch.undo()
        counts.append(len(calls))
        plans.append(p)
    assert counts[0] == counts[1] <= 3 + 1 + 1 + 1 + FINAL_SIMULATIONS
    for p in plans:
        assert p.sfb["applied_to"] == "search" and p.sfb["solves"] == 0  # no MILP past the deadline
        data = json.loads(json.dumps(p.to_dict()))  # still a whole plan
        assert Simulator(g, p.topology, prof).run(Strategy.from_dict(data["strategy"])).iteration_time_s == \
            pytest.approx(data["tag"]["iteration_time_s"])


def _evaluator(topo: Topology):
    g, prof = _problem()
    sim = Simulator(g, topo, prof)
    groups = OpGroups(np.arange(sim.n) % 2, np.ones(2), 0)
    speed = device_speed(sim)
    space = ActionSpace.build(sim, speed)
    return Evaluator(sim, groups, space, speed / speed.sum(), speed=speed)


def test_the_uniform_incumbent_scores_nothing_past_the_deadline_and_everything_without_one():
    ev = _evaluator(_cluster(9))
    assert _best_uniform_plan(ev, 2, Deadline(at=0.0)) is None and ev.simulations == 0
    best = _best_uniform_plan(ev, 2, Deadline(at=None))
    assert ev.simulations == ev.space.size
    scores = [ev.score(np.full(2, a)) for a in range(ev.space.size)]
    assert (ev.score(best).oom, ev.score(best).time_s) == min((s.oom, s.time_s) for s in scores)


def test_sfb_trials_stop_where_only_the_final_runs_time_is_left():
    assert Deadline(at=None).sfb_trial_fits(1e9)
    late = Deadline(at=0.0, seconds_per_simulation=1.0)
    assert not late.sfb_time_left() and not late.sfb_trial_fits(0.0)
    soon = Deadline(at=time.perf_counter() + 100.0, seconds_per_simulation=1.0, slowest_s=4.0)
    final_s = FINAL_SIMULATIONS * 1.0 + 4.0
    assert soon.sfb_trial_fits(80.0 - final_s) and not soon.sfb_trial_fits(100.0 - final_s)


def test_a_seconds_budget_holds_back_its_sfb_share_unless_sfb_is_off():
    budget = Budget(seconds=100.0)
    with_sfb, without = Deadline.starting_now(budget), Deadline.starting_now(budget, sfb=False)
    assert with_sfb.reserve_s == SFB_SHARE * 100.0 and without.reserve_s == 0.0
    assert Deadline.starting_now(Budget(iterations=3)).reserve_s == 0.0


def test_ideal_time_per_gpu_type_is_the_per_device_sum():
    sim = _evaluator(_cluster(9)).sim
    rate = 0.0
    for gpu in sim.dev_gpu:
        rate += 1.0 / max(float(sim.compute.times(gpu, sim.batch).sum()), 1e-12)
    assert ideal_time_s(sim) == 1.0 / rate


def _allgather_reference(total, shares, per_machine, intra, inter, lat_in, lat_out):
    """The all-gather cost machine by machine (what hierarchical_allgather_time computes once per kind)."""
    bounds = np.cumsum([0] + list(per_machine))
    pieces = [(np.asarray(shares[a:b]), bw) for a, b, bw in zip(bounds[:-1], bounds[1:], intra) if b > a]
    if len(pieces) == 1:
        local, bw = pieces[0]
        return allgather_time(total * float(local.max()) * len(local), len(local), bw, lat_in)
    inside = spread = 0.0 * total
    for local, bw in pieces:
        inside = np.maximum(inside, allgather_time(total * float(local.max()) * len(local), len(local), bw, lat_in))
        spread = np.maximum(spread, broadcast_time(total * (1.0 - float(local.sum())), len(local), bw, lat_in))
    largest = max(float(local.sum()) for local, _ in pieces)
    return inside + allgather_time(total * largest * len(pieces), len(pieces), inter, lat_out) + spread


def test_the_all_gather_of_many_machines_costs_exactly_what_machine_by_machine_does():
    rng = np.random.default_rng(3)
    for trial in range(300):
        per_machine = rng.integers(0, 9, int(rng.integers(1, 12))).tolist()
        per_machine[0] = max(per_machine[0], 1)
        raw = rng.choice([1.0, 2.0, 3.0], sum(per_machine)) if trial % 2 else rng.random(sum(per_machine))
        shares = raw / raw.sum()
        intra = rng.choice([50.0, 100.0, 300.0], len(per_machine)).tolist()
        total = rng.random(4) * 1e8 if trial % 3 else 1.5e6
        got = hierarchical_allgather_time(total, shares, per_machine, intra, 25.0, 1e-6, 5e-6)
        want = _allgather_reference(total, shares, per_machine, intra, 25.0, 1e-6, 5e-6)
        assert np.array_equal(np.asarray(got), np.asarray(want)), trial


def _peaks_by_sorting_events(base, lens, start, free, size, t_ptr, t_alloc, t_free, t_size):
    """The definition: per slot, events in time order (frees first at one instant), live bytes just after
    each allocation of some bytes."""
    out = []
    for sl in range(len(base)):
        chain = slice(base[sl], base[sl] + lens[sl])
        got = slice(t_ptr[sl], t_ptr[sl + 1])
        buffers = list(zip(start[chain], free[chain], size[chain])) + list(zip(t_alloc[got], t_free[got], t_size[got]))
        events = sorted([(a, 1, b) for a, _, b in buffers] + [(f, 0, -b) for _, f, b in buffers], key=lambda e: e[:2])
        live, best = 0.0, 0.0
        for _, is_alloc, amount in events:
            live += amount
            if is_alloc and amount > 0:
                best = max(best, live)
        out.append(best)
    return np.array(out)


def test_the_peak_memory_sweep_matches_sorting_every_event():
    rng = np.random.default_rng(7)
    for trial in range(30):
        lens = rng.integers(0, 40, size=rng.integers(1, 6))
        base = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        # A chain allocates in time order; ties and zero-byte outputs happen (grid times, some sizes 0).
        start = np.concatenate([np.sort(rng.integers(0, 20, n)) for n in lens]).astype(float) / 4
        dur = rng.integers(0, 3, len(start)) / 4 * (trial % 2)  # zero durations tie a start with its end
        free = start + rng.integers(0, 30, len(start)) / 4 * (rng.random(len(start)) < 0.9)
        # The entry whose end frees a buffer is only where the sweep starts looking: any entry (or none) is right.
        freed_by = np.concatenate([rng.integers(-1, n, n) for n in lens]).astype(np.int64)
        size = rng.integers(0, 5, len(start)).astype(float) * 1e6
        received = rng.integers(0, 8, len(lens))
        t_ptr = np.concatenate([[0], np.cumsum(received)]).astype(np.int64)
        t_alloc = rng.integers(0, 20, t_ptr[-1]).astype(float) / 4
        t_free = t_alloc + rng.integers(0, 30, t_ptr[-1]) / 4
        t_size = rng.integers(0, 5, t_ptr[-1]).astype(float) * 1e6
        t_freed_by = np.concatenate([rng.integers(-1, n, k) for n, k in zip(lens, received)]).astype(np.int64)
        args = (base, lens.astype(np.int64), start, free, size, t_ptr, t_alloc, t_free, t_size)
        got = np.zeros(len(lens))
        memory._sweep(0, len(lens), got, base, lens.astype(np.int64), dur, start + dur, free, freed_by, size, t_ptr,
                      t_alloc, t_free, t_freed_by, t_size)
        assert np.allclose(got, _peaks_by_sorting_events(*args), rtol=1e-12), trial


def test_peak_memory_of_many_slots_is_the_flat_simulation_s():
    ev = _evaluator(_cluster(9))
    g, prof = _problem()
    flat = Simulator(g, ev.sim.topology, prof, collapse=False)  # every device its own slot
    allreduce = ev.space.all_machines
    ps, model_parallel = allreduce + OPTIONS.index("ps"), allreduce + MODEL_PARALLEL  # many slots each
    for actions in (np.array([allreduce, model_parallel]), np.array([ps, allreduce])):
        collapsed = ev.sim.run(ev.strategy(actions))
        every = flat.run(ev.strategy(actions))
        assert collapsed.simulated_slots > 2 and every.simulated_slots > collapsed.simulated_slots
        assert every.iteration_time_s == pytest.approx(collapsed.iteration_time_s, rel=1e-12)
        assert np.allclose(every.peak_memory_bytes, collapsed.peak_memory_bytes, rtol=1e-12)


def test_slot_kernels_in_threads_give_what_one_thread_gives(monkeypatch):
    from tag_core.simulate import parallel

    ev = _evaluator(_cluster(9))
    allreduce = ev.space.all_machines
    ps, model_parallel = allreduce + OPTIONS.index("ps"), allreduce + MODEL_PARALLEL  # many slots each
    plans = [ev.strategy(a) for a in (np.array([allreduce, model_parallel]), np.array([ps, allreduce]))]
    monkeypatch.setattr(parallel, "MAX_THREADS", 1)
    alone = [ev.sim.run(s) for s in plans]
    monkeypatch.setattr(parallel, "MAX_THREADS", 3)
    monkeypatch.setattr(parallel, "MIN_ENTRIES", 0)
    monkeypatch.setattr(parallel, "usable_cpus", lambda: 3)
    assert len(parallel.slot_ranges(np.array([5, 1, 7, 2]))) == 3
    for one, threaded in zip(alone, (ev.sim.run(s) for s in plans)):
        assert threaded.simulated_slots > 2
        assert threaded.iteration_time_s == one.iteration_time_s
        assert np.array_equal(threaded.peak_memory_bytes, one.peak_memory_bytes)
        assert np.array_equal(threaded.op_end_s, one.op_end_s)


def test_each_slot_s_chain_is_what_it_runs_in_execution_order(monkeypatch):
    """Chains come from shared templates merged with each slot's single-device ops (PS updates at the end,
    model-parallel parts in between): each must be the slot's ops, in order, with running sums of durations."""
    import tag_core.simulate.simulator as simulator_module
    from tag_core.simulate.engine import schedule

    ev = _evaluator(_cluster(9))
    allreduce = ev.space.all_machines
    ps, model_parallel = allreduce + OPTIONS.index("ps"), allreduce + MODEL_PARALLEL
    seen = []
    monkeypatch.setattr(simulator_module, "schedule", lambda *a, **k: seen.append(schedule(*a, **k)) or seen[-1])
    for actions in ([allreduce, model_parallel], [ps, allreduce], [ps, model_parallel]):
        ev.sim.run(ev.strategy(np.array(actions)))
        sched = seen[-1]
        ch, order = sched.chains, ev.sim.order
        assert len(ch.lens) > 2
        for k, (ops, dur, end) in enumerate(zip(ch.per_slot(ch.ops), ch.per_slot(ch.dur), ch.per_slot(sched.end))):
            expected = order[sched.on[k, order]]
            assert np.array_equal(ops, expected), (actions, k)
            assert np.array_equal(sched.cidx[k, ops], np.arange(len(ops)))
            assert (sched.cidx[k] >= 0).sum() == len(ops)
            assert np.all(dur > 0) and np.all(np.diff(end) >= dur[1:] - 1e-12)  # one op at a time, in chain order
