"""Baselines as strategies, Strategy JSON, and `tag simulate`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from simgraphs import profiles, topology, train_graph

from tag_core.errors import TagInputError
from tag_core.search import BASELINES, baseline, device_speed, run_baselines
from tag_core.search.baselines import HOROVOD_FUSION_BYTES
from tag_core.simulate import Simulator, Strategy

ROOT = Path(__file__).parent.parent


def _mixed():
    g = train_graph(layers=4)
    topo = topology(("fast", "V100-32GB", 2, 100.0), ("slow", "T4", 2, 50.0), inter_gbps=25.0)
    return g, topo, Simulator(g, topo, profiles(g, "cpu", per_sample_us=100.0, constant_us=20.0))


def test_dp_nccl_splits_evenly_and_syncs_after_backward():
    g, topo, sim = _mixed()
    s = baseline("dp-nccl", sim)
    assert s.name == "dp-nccl" and s.options == ["allreduce"] and s.masks.all()
    assert np.allclose(s.batch_shares, 1.0) and not s.overlap and s.fusion_bytes == 0


def test_dp_nccl_p_shares_follow_device_speed_and_help_on_mixed_gpus():
    g, topo, sim = _mixed()
    s = baseline("dp-nccl-p", sim)
    speed = device_speed(sim)
    assert speed[0] > speed[2]
    assert np.allclose(s.batch_shares, speed / speed.sum())
    results = run_baselines(sim)
    assert set(results) == set(BASELINES)
    assert results["dp-nccl-p"][1].iteration_time_s < results["dp-nccl"][1].iteration_time_s
    # With proportional shares the fast and slow devices finish their compute closer together.
    even, prop = results["dp-nccl"][1].busy_s, results["dp-nccl-p"][1].busy_s
    assert prop.max() / prop.min() < even.max() / even.min()


def test_horovod_fuses_buckets_and_overlaps():
    g, topo, sim = _mixed()
    s = baseline("horovod", sim)
    assert s.overlap and s.fusion_bytes == HOROVOD_FUSION_BYTES
    fused = sim.run(s)
    plain = sim.run(baseline("dp-nccl", sim))
    # Four 4 MB gradients fit one bucket: one collective's latency instead of four.
    assert fused.comm_s["allreduce"] < plain.comm_s["allreduce"]
    assert fused.iteration_time_s < plain.iteration_time_s


def test_single_picks_the_fastest_device():
    g, topo, sim = _mixed()
    s = baseline("single", sim)
    assert (s.batch_shares > 0).sum() == 1
    chosen = int(np.flatnonzero(s.batch_shares)[0])
    assert topo.devices[chosen].gpu.name == "V100-32GB"
    r = sim.run(s)
    assert sum(r.comm_s.values()) == 0 and r.busy_s[chosen] == pytest.approx(r.iteration_time_s)


def test_unknown_baseline_is_an_input_error():
    g, topo, sim = _mixed()
    with pytest.raises(TagInputError, match="strategy: unknown baseline"):
        baseline("dp-magic", sim)


def test_strategy_json_round_trip_and_field_errors():
    s = Strategy(np.array([0, 1, 1, 0]), np.array([[1, 0], [1, 1]], bool), ["ps", "model_parallel"],
                 np.array([1.0, 2.0, 0.0]), fusion_bytes=128, overlap=False, op_devices=np.array([-1, 1, 2, -1]),
                 name="mine")
    back = Strategy.from_json(s.to_json())
    assert back.key() == s.key() and back.name == "mine"
    one = Strategy.uniform(5, 2, 3)
    assert json.loads(one.to_json())["op_groups"] is None
    assert Strategy.from_json(one.to_json()).key() == one.key()
    bad = json.loads(s.to_json())
    bad["groups"][1]["option"] = "teleport"
    with pytest.raises(TagInputError, match=r"groups\[1\]\.option"):
        Strategy.from_dict(bad)
    bad = json.loads(s.to_json())
    bad["groups"][0]["mask"] = [0, 0]
    with pytest.raises(TagInputError, match=r"groups\[0\]\.mask"):
        Strategy.from_dict(bad)
    bad = json.loads(s.to_json())
    del bad["batch_shares"]
    with pytest.raises(TagInputError, match="batch_shares: missing"):
        Strategy.from_dict(bad)
    with pytest.raises(TagInputError, match="strategy: not valid JSON"):
        Strategy.from_json("{nope")
    # A plan file that embeds the strategy reads the same.
    assert Strategy.from_dict({"model": "m", "strategy": s.to_dict()}).key() == s.key()


@pytest.mark.slow
def test_tag_simulate_cli(tmp_path, tag_home, capsys):
    from tag_core.cli import main

    topo = ROOT / "examples" / "topologies" / "testbed.json"
    png = tmp_path / "gantt.png"
    assert main(["simulate", "mlp", "--topology", str(topo), "--strategy", "dp-nccl", "--json",
                 "--timeline", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["iteration_time_s"] > 0 and data["oom"] is False
    assert len(data["peak_memory_bytes"]) == 16 and len(data["busy_s"]) == 16 and len(data["idle_s"]) == 16
    assert data["comm_s"]["allreduce"] > 0
    assert png.stat().st_size > 10_000
    # A strategy file round-trips through the CLI and gives the same answer.
    from tag_core import store
    from tag_core.capture import load_op_graph
    conn = store.connect()
    graph = load_op_graph(conn, "mlp")
    conn.close()
    plan = tmp_path / "plan.json"
    plan.write_text(Strategy.uniform(len(graph.ops), 7, 16, overlap=False, name="file").to_json())
    assert main(["simulate", "mlp", "--topology", str(topo), "--strategy", str(plan), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["iteration_time_s"] == pytest.approx(data["iteration_time_s"])
    # One option for every op, as `tag emit --strategy` takes it: PS everywhere pushes to parameter servers.
    assert main(["simulate", "mlp", "--topology", str(topo), "--strategy", "ps", "--json"]) == 0
    ps = json.loads(capsys.readouterr().out)
    assert ps["strategy"] == "ps" and ps["comm_s"]["allreduce"] == 0 and ps["iteration_time_s"] > 0
    # Bad input: exit code 2 with the field named.
    plan.write_text(json.dumps({"groups": [{"mask": [1], "option": "allreduce"}], "batch_shares": [1.0], "num_ops": 3}))
    assert main(["simulate", "mlp", "--topology", str(topo), "--strategy", str(plan)]) == 2
    assert "op_groups" in capsys.readouterr().err
    assert main(["simulate", "mlp", "--topology", str(topo), "--strategy", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown baseline" in err and "model_parallel" in err
