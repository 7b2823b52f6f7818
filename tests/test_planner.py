"""plan(): the plan JSON, baselines, ideal time, lineage, warm starts, out-of-memory handling;
and `tag plan` end to end on a tiny captured model, bad input included."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pytest
from simgraphs import profiles, topology, train_graph

from tag_core import store
from tag_core.cli import main
from tag_core.cluster import GpuType
from tag_core.errors import TagInputError
from tag_core.plan import (
    code_version,
    ideal_time_s,
    make_groups,
    markdown_table,
    plan,
    profile_batch_sizes,
    warm_start_actions,
)
from tag_core.search import ActionSpace, Budget, device_speed
from tag_core.simulate import Simulator, Strategy

MODEL = "mlp[features=16,hidden=8]"


def _mixed(**kw):
    return topology(("fast", "V100-32GB", 2, 100.0), ("slow1", "T4", 2, 50.0), ("slow2", "T4", 2, 50.0),
                    inter_gbps=kw.get("inter", 10.0))


def _plan(topo=None, layers: int = 6, **kwargs):
    g = train_graph(layers=layers)
    prof = profiles(g, "cpu", per_sample_us=100.0, constant_us=20.0)
    kwargs.setdefault("budget", Budget(iterations=30))
    kwargs.setdefault("num_groups", 6)
    return g, prof, plan(g, topo or _mixed(), prof, profile_hash="p123", **kwargs)


def test_plan_json_carries_every_field_and_beats_the_baselines():
    g, prof, p = _plan()
    data = json.loads(json.dumps(p.to_dict()))  # JSON-clean
    assert {"model", "topology", "batch_size", "groups", "strategy", "tag", "baselines", "speedup_vs_dp_nccl",
            "ideal_time_s", "oom", "search", "lineage"} <= set(data)
    assert data["model"] == "hand" and data["topology"] == "test" and data["batch_size"] == g.batch_size
    assert data["groups"] == p.groups.num_groups
    assert set(data["baselines"]) == {"dp_nccl", "dp_nccl_p", "horovod", "mcmc"}
    assert set(data["search"]) == {"iterations", "simulations", "wall_s", "first_better_than_dp_iteration"}
    tag = data["tag"]["iteration_time_s"]
    baselines = [b["iteration_time_s"] for b in data["baselines"].values()]
    assert tag <= min(baselines) + 1e-12
    assert data["speedup_vs_dp_nccl"] == pytest.approx(data["baselines"]["dp_nccl"]["iteration_time_s"] / tag)
    assert 0 < data["ideal_time_s"] <= tag
    assert data["oom"] is False
    assert data["search"]["iterations"] == 30  # the default plan, scored first, is iteration 1
    assert 1 <= data["search"]["simulations"] <= data["search"]["iterations"] + 10
    # The strategy round-trips and re-simulates to the reported time.
    strategy = Strategy.from_dict(data["strategy"])
    sim = Simulator(g, _mixed(), prof)
    assert sim.run(strategy).iteration_time_s == pytest.approx(tag)
    lineage = data["lineage"]
    assert lineage["graph_hash"] == g.content_hash() and lineage["profile_hash"] == "p123"
    assert lineage["groups_hash"] == make_groups(g, prof, 6).content_hash()
    assert lineage["topology_hash"] == _mixed().content_hash()
    assert lineage["code_version"] == code_version() and lineage["seed"] == 0
    assert lineage["budget"] == {"iterations": 30}
    table = markdown_table(data)
    assert table.count("\n") == 1 + 1 + 4 + 1 and "| DP-NCCL |" in table and "| MCMC |" in table


def test_plan_is_deterministic_for_a_seed():
    _, _, a = _plan(seed=4)
    _, _, b = _plan(seed=4)
    assert a.tag.time_s == b.tag.time_s and np.array_equal(a.tag.actions, b.tag.actions)
    assert a.mcmc.time_s == b.mcmc.time_s


def test_mcmc_gets_the_same_simulation_budget():
    _, _, p = _plan()
    assert p.mcmc.simulations == p.evaluator.simulations
    # The setting probes: AllReduce under eight settings and PS under each distinct batch split (the balanced
    # one is the split by speed here), less the chosen setting's own one or two, which are MCTS's.
    assert p.simulations - p.evaluator.simulations in (7, 8, 9)
    assert p.baselines["mcmc"] == p.mcmc.time_s


def test_ideal_time_is_the_balanced_compute_lower_bound():
    g = train_graph(layers=2)
    topo = topology(("one", "V100-32GB", 1, 100.0), ("two", "T4", 1, 100.0))
    sim = Simulator(g, topo, profiles(g, "cpu"))
    v100 = sim.compute.times(topo.devices[0].gpu, sim.batch).sum()
    t4 = sim.compute.times(topo.devices[1].gpu, sim.batch).sum()
    assert ideal_time_s(sim) == pytest.approx(1.0 / (1.0 / v100 + 1.0 / t4))


def test_warm_start_maps_a_plan_onto_a_changed_topology():
    g, prof, first = _plan()
    previous = first.to_dict()
    assert previous["strategy"]["extra"]["machines"] == ["fast", "slow1", "slow2"]
    # Same machines: every group keeps its mask and option.
    sim = Simulator(g, _mixed(), prof)
    same = warm_start_actions(previous, g, _mixed(), first.groups, ActionSpace.build(sim, device_speed(sim)))
    assert [a for a in first.actions] == [ActionSpace.build(sim, device_speed(sim)).describe(a) for a in same]
    # slow1 leaves and the machines come in another order: masks map by machine name.
    G = first.groups.num_groups
    masks = np.ones((G, 3), dtype=bool)
    masks[0], masks[1] = [False, True, False], [False, False, True]  # only on slow1; only on slow2
    options = ["duplicate", "ps"] + ["allreduce"] * (G - 2)
    old = Strategy(first.groups.assignment, masks, options, np.ones(6), extra={"machines": ["fast", "slow1", "slow2"]})
    smaller = topology(("slow2", "T4", 2, 50.0), ("fast", "V100-32GB", 2, 100.0), inter_gbps=10.0)
    sim = Simulator(g, smaller, prof)
    space = ActionSpace.build(sim, device_speed(sim))
    actions = warm_start_actions(old, g, smaller, first.groups, space)
    masks = [space.mask(a).tolist() for a in actions]
    assert masks[0] == [True, True]  # its machine is gone: every machine
    assert masks[1] == [True, False]  # slow2, now the first machine
    assert all(m == [True, True] for m in masks[2:])
    assert [space.option(a) for a in actions] == old.options
    # A warm-started search begins from the previous plan and can only improve on it.
    _, _, again = _plan(warm_start=previous, budget=Budget(iterations=3))
    assert again.time_s <= first.time_s  # the plans (SFB included)


def _tiny(mem_gb: float) -> GpuType:
    return GpuType("tiny", tflops=10.0, mem_gb=mem_gb, mem_bw_gbps=500.0)


def test_out_of_memory_everywhere_moves_to_model_parallelism():
    topo = topology(("a", _tiny(0.04), 2, 100.0), ("b", _tiny(0.04), 2, 100.0), inter_gbps=10.0)
    _, _, p = _plan(topo=topo, num_groups=2)  # groups big enough to split over four devices
    assert p.baseline_oom["dp_nccl"] and p.baseline_oom["horovod"]
    assert p.settings["out_of_memory_mode"] is True
    assert not p.oom and "model_parallel" in p.strategy.options
    assert p.to_dict()["speedup_vs_dp_nccl"] is None


def test_a_model_that_fits_nowhere_names_the_memory_it_needs():
    topo = topology(("a", _tiny(0.001), 2, 100.0), inter_gbps=10.0)
    with pytest.raises(TagInputError) as err:
        _plan(topo=topo)
    message = str(err.value)
    assert err.value.where == "model" and "\n" not in message
    assert "fits no device set" in message and "GB" in message and "the cluster has 0.00 GB" in message


def test_the_table_says_how_many_devices_compute_when_the_batch_leaves_some_idle():
    """A batch of 8 on 16 GPUs: at most 8 replicas get rows, and `tag plan` says so."""
    from tag_core.cli.plan import format_table

    topo = topology(*[(f"m{i}", "V100-32GB", 4, 100.0) for i in range(4)], inter_gbps=10.0)
    _, _, p = _plan(topo, budget=Budget(iterations=10))
    data = p.to_dict()
    computing = data["tag"]["computing_devices"]
    assert 1 <= computing <= 8
    assert (f"devices: {computing} of 16 compute (a batch of 8 gives whole rows to at most 8 replicas; "
            "--batch-size sets it)") in format_table(data, p.actions)
    assert "devices:" not in format_table({**data, "tag": {**data["tag"], "computing_devices": 16}}, p.actions)


def test_profile_batch_sizes_are_divisors_near_the_replica_shares():
    topo = topology(("a", "V100-32GB", 4, 100.0), ("b", "T4", 2, 100.0), ("c", "T4", 2, 100.0))
    assert profile_batch_sizes(32, topo) == [4, 8]  # 32 / 8 devices, 32 / 4 on the largest machine
    assert profile_batch_sizes(30, topo) == [3, 6]  # 3.75 -> 3 (divisor of 30), 7.5 -> 6
    assert profile_batch_sizes(1, topo) == [1]


# ---- the command -------------------------------------------------------------------------


def _topology_file(tmp_path: Path, name: str = "tiny", mem_gb: float | None = None, both: bool = False,
                   tflops: float = 1.0) -> Path:
    gpu = "T4" if mem_gb is None else {"name": "tiny", "tflops": tflops, "mem_gb": mem_gb,
                                       "mem_bw_gbps": 100.0 * tflops}
    data = {"name": name, "machines": [{"name": "m0", "gpu": gpu if both else "V100-16GB", "count": 2, "intra_gbps": 100},
                                       {"name": "m1", "gpu": gpu, "count": 2, "intra_gbps": 50}], "inter_gbps": 10}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """One `tag plan` run on a fresh store: it captures, profiles and plans."""
    tmp = tmp_path_factory.mktemp("plan")
    db, topo, out = tmp / "tag.duckdb", _topology_file(tmp), tmp / "plan.json"
    code = main(["--db", str(db), "plan", MODEL, "--topology", str(topo), "--budget-iterations", "20",
                 "--groups", "8", "--batch-size", "8", "--out", str(out)])
    return code, db, topo, out, tmp


@pytest.mark.slow
def test_tag_plan_profiles_first_then_writes_the_plan(planned, capsys):
    code, db, topo, out, _ = planned
    assert code == 0
    data = json.loads(out.read_text())
    assert data["model"] == MODEL and data["topology"] == "tiny" and data["batch_size"] == 8
    assert data["groups"] <= 8 and data["search"]["iterations"] == 20
    with duckdb.connect(str(db), read_only=True) as conn:
        sizes = sorted(r[0] for r in conn.execute(
            "SELECT DISTINCT batch_size FROM op_profiles WHERE model = ?", [MODEL]).fetchall())
        plans = store.load_plans(conn, MODEL, "tiny")
        profile_hash = store.profile_set_hash(conn, MODEL)
    assert sizes == [2, 4]  # 8 / 4 devices, 8 / 2 on the largest machine
    assert len(plans) == 1 and plans.source[0] == "cli"
    assert plans.tag_time_s[0] == data["tag"]["iteration_time_s"]
    assert data["lineage"]["profile_hash"] == profile_hash == plans.profile_hash[0]
    assert not list(out.parent.glob(".plan.json.*"))  # no temporary left behind


@pytest.mark.slow
def test_tag_plan_json_and_table(planned, capsys):
    _, db, topo, _, _ = planned
    assert main(["--db", str(db), "plan", MODEL, "--topology", str(topo), "--budget-iterations", "5",
                 "--groups", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["search"]["iterations"] == 5 and data["lineage"]["budget"] == {"iterations": 5}
    assert main(["--db", str(db), "plan", MODEL, "--topology", str(topo), "--budget-seconds", "0.5",
                 "--groups", "8"]) == 0
    text = capsys.readouterr().out
    for label in ("TAG", "DP-NCCL", "DP-NCCL-P", "Horovod", "MCMC", "ideal"):
        assert label in text
    assert "simulations" in text and "groups:" in text


@pytest.mark.parametrize("args,where", [
    (["--budget-iterations", "0"], "--budget-iterations"),
    (["--budget-seconds", "-1"], "--budget-seconds"),
    (["--budget-iterations", "3", "--budget-seconds", "1"], "not allowed with"),
    (["--groups", "0"], "--groups"),
    (["--seed", "-2"], "--seed"),
])
@pytest.mark.slow
def test_tag_plan_bad_arguments_exit_2(planned, args, where, capsys):
    _, db, topo, _, _ = planned
    with pytest.raises(SystemExit) as exit_info:
        main(["--db", str(db), "plan", MODEL, "--topology", str(topo), *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tag: error:") and where in err and "\n" not in err


@pytest.mark.parametrize("tflops", [1.0, 1000.0])
@pytest.mark.slow
def test_tag_plan_keeps_to_the_machines_that_fit(planned, capsys, tmp_path, tflops):
    """m1's GPUs hold nothing; m0's V100s hold the model. Slow ones: the balanced batch split gives them no
    rows, so the all-machines plan fits. Fast ones get rows under every split: out-of-memory mode."""
    _, db, _, _, _ = planned
    half = _topology_file(tmp_path, "half", mem_gb=1e-8, tflops=tflops)
    assert main(["--db", str(db), "plan", MODEL, "--topology", str(half), "--budget-iterations", "5",
                 "--groups", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["oom"] is False and data["baselines"]["dp_nccl"]["oom"] is True and data["speedup_vs_dp_nccl"] is None
    settings = data["tag"]["settings"]
    if tflops < 15.7:
        assert settings["batch_shares"] == "balanced" and settings["out_of_memory_mode"] is False
    else:
        assert settings["out_of_memory_mode"] is True
        assert all(group["mask"][1] == 0 for group in data["strategy"]["groups"])
    assert data["tag"]["computing_devices"] <= 2


@pytest.mark.slow
def test_tag_plan_input_errors_exit_2(planned, capsys, tmp_path):
    _, db, topo, _, _ = planned
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{nope")
    not_a_plan = tmp_path / "other.json"
    not_a_plan.write_text(json.dumps({"groups": [], "batch_shares": [1]}))
    cases = [
        (["--topology", str(tmp_path / "missing.json")], "missing.json"),
        (["--topology", str(topo), "--out", str(tmp_path / "no" / "dir" / "p.json")], "--out"),
        (["--topology", str(topo), "--warm-start", str(tmp_path / "gone.json")], "--warm-start"),
        (["--topology", str(topo), "--warm-start", str(bad_json)], "not valid JSON"),
        (["--topology", str(topo), "--warm-start", str(not_a_plan), "--budget-iterations", "1"], "--warm-start"),
        (["--topology", str(_topology_file(tmp_path, "small", mem_gb=1e-8, both=True))], "fits no device set"),
    ]
    for args, expected in cases:
        assert main(["--db", str(db), "plan", MODEL, *args]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tag: error:") and expected in err[0], (args, err)


def test_a_misleading_prior_still_gets_the_best_uniform_plan():
    """A prior sure of the worst action: the search under it still starts from the best plan that puts
    every group on one action, and pays one simulation per action for it."""
    g = train_graph(layers=6)
    prof = profiles(g, "cpu", per_sample_us=100.0, constant_us=20.0)
    topo = _mixed()
    uniform_times = {}

    def misleading(state):
        space = state.evaluator.space
        if not uniform_times:
            uniform_times.update({a: state.evaluator.score(np.full(len(state.actions), a)) for a in range(space.size)})
        worst = max(uniform_times, key=lambda a: (uniform_times[a].oom, uniform_times[a].time_s))
        p = np.full(space.size, 1e-9)
        p[worst] = 1.0
        return p

    budget = Budget(iterations=5)
    guided = plan(g, topo, prof, num_groups=6, budget=budget, prior=misleading, sfb=False)
    best_uniform = min(s.time_s for s in uniform_times.values() if not s.oom)
    assert guided.tag.time_s <= best_uniform + 1e-12
    assert guided.tag.simulations >= len(uniform_times)


@pytest.mark.slow
def test_a_plan_file_is_simulated_at_its_own_batch(planned, capsys):
    _, db, topo, out, _ = planned
    plan = json.loads(out.read_text())
    capsys.readouterr()
    assert main(["--db", str(db), "simulate", MODEL, "--topology", str(topo), "--strategy", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["batch_size"] == plan["batch_size"] == 8  # not the model's default
    assert data["iteration_time_s"] == pytest.approx(plan["tag"]["iteration_time_s"])


# ---- calibrated topologies ---------------------------------------------------------------


def _calibration_for(topo, inter_latency_s: float = 1e-3, inter_gbps: float = 5.0):
    from tag_core.cluster.calibration import Calibration, Fit, Overheads

    fit = Fit(latency_s=inter_latency_s, gbps=inter_gbps, residual_rms_s=0.0, residual_max_rel=0.0, samples=8)
    intra = Fit(latency_s=2e-5, gbps=80.0, residual_rms_s=0.0, residual_max_rel=0.0, samples=8)
    return Calibration(topology=topo.name, topology_hash=topo.content_hash(), source="import", host="elsewhere",
                       code_version="test", links={"inter": fit, "intra": intra}, collectives={},
                       overheads=Overheads(per_op_s=1e-5, per_step_s=1e-3, per_transfer_s=1e-3))


def test_a_calibrated_plan_reports_both_predictions_and_its_calibration():
    from tag_core.simulate import CommModel

    topo = _mixed()
    calibration = _calibration_for(topo)
    g, prof, result = _plan(topo, comm=CommModel.from_calibration(calibration))
    data = result.to_dict()
    assert data["calibration"]["applied"] and data["calibration"]["hash"] == calibration.calibration_hash
    assert data["lineage"]["calibration"] == calibration.calibration_hash
    # The plan's time is the calibrated one; the defaults' time of the same strategy is beside it.
    assert data["tag"]["iteration_time_s"] == pytest.approx(
        Simulator(g, topo, prof, comm=CommModel.from_calibration(calibration)).run(result.strategy).iteration_time_s)
    assert data["calibration"]["uncalibrated_time_s"] == pytest.approx(
        Simulator(g, topo, prof).run(result.strategy).iteration_time_s)
    _, _, plain = _plan(topo, uncalibrated_because="none for this test")
    assert plain.to_dict()["calibration"] == {"applied": False, "why": "none for this test"}
    assert plain.to_dict()["lineage"]["calibration"] is None


def test_a_plan_is_single_and_says_why_when_no_distributed_strategy_beats_one_device():
    from tag_core.simulate import CommModel

    topo = topology(("a", "cpu", 1, 100.0), ("b", "cpu", 1, 100.0), inter_gbps=10.0)
    # Loopback-like: every transfer costs 50 ms, far more than the whole step on one device.
    slow = CommModel.from_calibration(_calibration_for(topo, inter_latency_s=0.05, inter_gbps=1.0))
    g, prof, result = _plan(topo, layers=2, comm=slow)
    data = result.to_dict()
    one = Simulator(g, topo, prof, comm=slow).run(Strategy.from_dict(data["strategy"]))
    assert data["strategy"]["name"] == "single" and data["one_device"]["device"] == 0  # task 0: the client's
    assert data["tag"]["iteration_time_s"] == pytest.approx(one.iteration_time_s)
    assert "no distributed strategy beats one device under the calibrated cost model" in data["one_device"]["why"]
    assert data["tag"]["iteration_time_s"] < data["baselines"]["dp_nccl"]["iteration_time_s"]
    assert "The plan is `single`" in markdown_table(data)
    # Communication that costs nothing next to compute: a distributed plan wins, and nothing is said.
    fast = CommModel.from_calibration(_calibration_for(topo, inter_latency_s=1e-6, inter_gbps=1000.0))
    _, _, distributed = _plan(topo, layers=2, comm=fast)
    assert "one_device" not in distributed.to_dict()
    assert distributed.strategy.name != "single" and distributed.time_s < one.iteration_time_s


@pytest.mark.slow
def test_tag_plan_applies_the_calibration_of_this_snapshot_only(planned, tmp_path, capsys):
    from tag_core.cluster import load_topology
    from tag_core.cluster.calibration import save_to_store

    _, db, topo_file, _, _ = planned
    copy = tmp_path / "tag.duckdb"
    copy.write_bytes(db.read_bytes())
    topo = load_topology(topo_file)
    calibration = _calibration_for(topo)
    with store.connect(copy) as conn:
        save_to_store(conn, calibration)
    args = ["--db", str(copy), "plan", MODEL, "--topology", str(topo_file), "--budget-iterations", "3", "--groups", "4",
            "--batch-size", "8", "--no-sfb", "--prior", "uniform"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["calibration"]["hash"] == calibration.calibration_hash and data["calibration"]["uncalibrated_time_s"] > 0
    with duckdb.connect(str(copy), read_only=True) as conn:
        assert conn.execute("SELECT calibration_hash FROM plan_lineage ORDER BY created_at DESC LIMIT 1").fetchone() \
            == (calibration.calibration_hash,)
    # Another snapshot of the same topology: the calibration is named with both hashes and not applied.
    changed = json.loads(topo_file.read_text())
    changed["inter_gbps"] = 20
    other = tmp_path / "tiny.json"
    other.write_text(json.dumps(changed))
    assert main([*args[:5], str(other), *args[6:]]) == 0
    table = capsys.readouterr().out
    assert f"calibration: none, calibration {calibration.calibration_hash} of tiny was made for snapshot " \
           f"{topo.content_hash()}, not this one ({load_topology(other).content_hash()})" in table


@pytest.mark.slow
def test_tag_plan_stays_on_one_device_when_the_measured_error_outweighs_the_gain(planned, tmp_path, capsys):
    from tag_core.cluster import load_topology

    _, db, topo_file, _, _ = planned
    copy = tmp_path / "tag.duckdb"
    copy.write_bytes(db.read_bytes())
    args = ["--db", str(copy), "plan", MODEL, "--topology", str(topo_file), "--budget-iterations", "3", "--groups", "4",
            "--batch-size", "8", "--no-sfb", "--prior", "uniform", "--json"]
    assert main(args) == 0
    unweighed = json.loads(capsys.readouterr().out)  # distributed or not: the profiles are this machine's
    assert "measured_error" not in unweighed["calibration"]
    with store.connect(copy) as conn:  # three steps measured at a tenth of their predictions
        for strategy in ("single", "dp-nccl", "tag"):
            store.save_measured_step(conn, {"model": MODEL, "topology": "tiny", "strategy": strategy, "steps": 10,
                                            "topology_hash": load_topology(topo_file).content_hash(),
                                            "predicted_s": 0.01, "measured_s": 0.1})
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["calibration"]["measured_error"] == {"median_abs_error": pytest.approx(0.9), "steps": 3,
                                                     "calibration_hash": None}
    # No plan on 4 devices is 90% faster than one: single, and when the search's plan was faster, the why says so.
    assert data["strategy"]["name"] == "single"
    weighed = "median |error| 90% over 3 measured" in data["one_device"]["why"]
    assert weighed is (unweighed["strategy"]["name"] != "single")


def test_sfb_is_tried_on_the_search_plan_the_best_uniform_plan_other_settings_and_the_defaults():
    from tag_core.plan.planner import _setting_evaluators
    from tag_core.plan.sfb_step import sfb_plan_candidates
    from tag_core.search import Evaluator

    g = train_graph(layers=4)
    prof = profiles(g, "cpu", per_sample_us=100.0, constant_us=20.0)
    sim = Simulator(g, _mixed(), prof)
    groups = make_groups(g, prof, 4)
    speed = device_speed(sim)
    space = ActionSpace.build(sim, speed)
    settings = list(_setting_evaluators(sim, groups, space, speed))
    chosen, ev = settings[0]
    default = space.all_machines
    G = groups.num_groups
    search = np.array([default, default + 1] * G)[:G]  # a mixed plan: not uniform
    for a in (default, default + 1, 5):
        ev.score(np.full(G, a))
    uniform = ev.best_uniform()
    candidates = sfb_plan_candidates(search, ev, {**chosen, "out_of_memory_mode": False}, default, settings)
    labels = [c[3] for c in candidates]
    assert labels[0] == "search" and candidates[0][1] is ev
    assert ("uniform" in labels) == (uniform[0] != default)
    others = [c for c in candidates if c[3] == "search, other settings"]
    assert len(others) == len(settings) - 1 and all(np.array_equal(c[0], search) for c in others)
    # The search's plan goes under every setting once.
    under = sorted(json.dumps(c[2], sort_keys=True) for c in candidates if c[3].startswith("search"))
    assert under == sorted(json.dumps({**s, "out_of_memory_mode": False}, sort_keys=True) for s, _ in settings)
    defaults = [c for c in candidates if c[3] == "default"]
    assert len(defaults) == len(settings) and all((c[0] == default).all() for c in defaults)
    assert labels == sorted(labels, key=["search", "default", "uniform", "search, other settings"].index)
    # Out-of-memory mode: the default is no candidate (it did not fit under any setting).
    oom = sfb_plan_candidates(search, ev, {**chosen, "out_of_memory_mode": True}, default, settings)
    assert "default" not in [c[3] for c in oom]
