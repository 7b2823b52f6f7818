"""A seconds budget bounds all of `plan`, and the GNN prior steps aside on problems too large for it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from simgraphs import profiles, topology, train_graph

from tag_core.cli import main
from tag_core.errors import TagInputError
from tag_core.gnn.prior import MAX_JOINT_EDGES, SHIPPED_CHECKPOINT, PriorChoice, joint_edges, load_prior, sized_prior
from tag_core.plan import plan
from tag_core.plan.deadline import Deadline
from tag_core.search import Budget
from tag_core.simulate import Simulator, Strategy


def _problem():
    g = train_graph(layers=4)
    topo = topology(("fast", "V100-32GB", 2, 100.0), ("slow", "T4", 2, 50.0), inter_gbps=10.0)
    return g, topo, profiles(g, "cpu", per_sample_us=100.0, constant_us=20.0)


def test_a_budget_spent_in_set_up_leaves_the_default_plan_and_one_sfb_candidate():
    g, topo, prof = _problem()
    p = plan(g, topo, prof, num_groups=4, budget=Budget(seconds=1e-9))
    assert p.tag.iterations == 1  # the seeded all-machines default, no search iteration
    assert p.mcmc.iterations == p.mcmc.simulations == 0  # no time left: MCMC's start, scored by the search
    assert p.baselines["mcmc"] == p.evaluator.score(p.start).time_s
    assert p.lineage["budget"] == {"seconds": 1e-9}
    assert p.sfb["applied_to"] == "search"  # the other eight candidates come after the deadline
    # Still a whole plan: its strategy simulates to the reported time.
    data = json.loads(json.dumps(p.to_dict()))
    assert Simulator(g, topo, prof).run(Strategy.from_dict(data["strategy"])).iteration_time_s == \
        pytest.approx(data["tag"]["iteration_time_s"])


def test_an_iterations_budget_is_never_cut_short():
    deadline = Deadline.starting_now(Budget(iterations=7))
    deadline.hold_back(1e9)
    assert deadline.search_budget(Budget(iterations=7)) == Budget(iterations=7)
    assert deadline.mcmc_budget(12) == Budget(simulations=12) and not deadline.passed()


def test_the_search_gets_what_the_work_after_it_leaves():
    deadline = Deadline.starting_now(Budget(seconds=100.0))
    deadline.hold_back(1.0)  # 21 simulations after the search at 1 s each, and SFB's 5 s
    search = deadline.search_budget(Budget(seconds=100.0)).seconds
    assert 0.75 * 73 < search <= 0.75 * 74
    deadline.hold_back(10.0)  # more than the whole budget: no search at all
    assert deadline.search_budget(Budget(seconds=100.0)).seconds == 0.0
    assert deadline.mcmc_budget(5) == Budget(simulations=5, seconds=0.0)


def test_the_gnn_prior_stands_aside_past_its_edge_bound():
    loaded = []

    def gnn():
        loaded.append(True)
        return load_prior(SHIPPED_CHECKPOINT, "test")

    assert sized_prior(gnn, None, 32, 60).kind == "gnn" and loaded
    assert joint_edges(32, 60) <= MAX_JOINT_EDGES < joint_edges(300, 60)
    loaded.clear()
    fallback = sized_prior(gnn, None, 300, 60)
    assert not loaded  # too large: the network is not even loaded
    assert fallback.kind == "uniform" and fallback.prior is None and fallback.lineage()["checkpoint"] is None
    assert f"{joint_edges(300, 60):,} edges" in fallback.warning and "uniform priors" in fallback.warning
    with pytest.raises(TagInputError) as asked:
        sized_prior(gnn, "gnn", 300, 60)
    assert asked.value.where == "--prior" and "--prior uniform" in asked.value.problem
    uniform = PriorChoice("uniform", None)
    assert sized_prior(lambda: uniform, "uniform", 4096, 60) is uniform  # asked for: no warning


def test_tag_plan_refuses_the_gnn_by_name_on_a_cluster_too_large_for_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TAG_HOME", str(tmp_path / "home"))
    machines = [{"name": f"m{i}", "gpu": "T4", "count": 1, "intra_gbps": 50} for i in range(300)]
    path = tmp_path / "wide.json"
    path.write_text(json.dumps({"name": "wide", "machines": machines, "inter_gbps": 10}))
    code = main(["plan", "mlp", "--topology", str(path), "--prior", "gnn"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("tag: error: --prior:"), err
    assert not (tmp_path / "home").exists()  # refused before the store or a capture


def test_channels_number_each_machine_then_each_pair_once():
    g, _, prof = _problem()
    topo = topology(*[(f"m{i}", "T4", 1 + i % 2, 50.0) for i in range(5)], inter_gbps=10.0)
    sim = Simulator(g, topo, prof)
    chan, M = sim.dev_channel_m, topo.num_machines
    assert np.array_equal(chan, chan.T) and np.array_equal(np.diag(chan), np.arange(M))
    pairs = chan[np.triu_indices(M, 1)]
    assert sorted(pairs.tolist()) == list(range(M, M + M * (M - 1) // 2)) and sim.num_channels == M + len(pairs)
    assert np.allclose(sim.channel_bps[pairs], sim.machine_bw[np.triu_indices(M, 1)] * 1e9 / 8)
