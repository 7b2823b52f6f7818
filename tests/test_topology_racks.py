"""Hierarchical topologies: racks, pods, uplinks; validation, level queries, `tag topology random --gpus`."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from tag_core.cli import main
from tag_core.cluster import load_topology, parse_topology, sized_topology
from tag_core.cluster.hierarchy import LEVEL_CLUSTER, LEVEL_MACHINE, LEVEL_POD, LEVEL_RACK, Uplink
from tag_core.errors import TagInputError

ROOT = Path(__file__).resolve().parents[1]
TWO_RACKS = ROOT / "examples" / "topologies_hierarchical" / "two_racks.json"
TESTBED = ROOT / "examples" / "topologies" / "testbed.json"

PODS = {
    "name": "pods",
    "machines": [
        {"name": "a0", "gpu": "V100-16GB", "count": 2, "intra_gbps": 150, "rack": "r0"},
        {"name": "a1", "gpu": "V100-16GB", "count": 2, "intra_gbps": 150, "rack": "r0"},
        {"name": "b0", "gpu": "T4", "count": 2, "intra_gbps": 64, "rack": "R1"},
        {"name": "c0", "gpu": "T4", "count": 2, "intra_gbps": 64, "rack": "r2"},
    ],
    "inter_gbps": 100,
    "links": [{"a": "a0", "b": "a1", "gbps": 80}],
    "racks": [{"name": "r0", "pod": "p0"}, {"name": "r1", "pod": "p0"}, {"name": "r2", "pod": "p1"}],
    "uplinks": {"rack": {"gbps": 50, "oversubscription": 2, "latency_us": 20},
                "pod": {"gbps": 40, "oversubscription": 4}},
}


def pods(**changes) -> dict:
    data = copy.deepcopy(PODS)
    data.update(changes)
    return data


def _edit(path: tuple, value) -> dict:
    data = pods()
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is _DROP:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


_DROP = object()


def test_hierarchical_file_parses_with_levels_and_bandwidths():
    topo = parse_topology(pods())
    h = topo.hierarchy
    assert h.hierarchical and h.num_racks == 3 and h.num_pods == 2
    assert h.machine_rack.tolist() == [0, 0, 1, 2] and h.rack_pod.tolist() == [0, 0, 1]
    assert h.rack_machines.tolist() == [2, 1, 1] and h.pod_machines.tolist() == [3, 1]
    a = np.array([0, 0, 0, 0, 2])
    b = np.array([0, 1, 2, 3, 3])
    assert topo.pair_level(a, b).tolist() == [LEVEL_MACHINE, LEVEL_RACK, LEVEL_POD, LEVEL_CLUSTER, LEVEL_CLUSTER]
    # intra; the a0-a1 link; across racks the rack uplink; across pods the slower of both uplinks
    assert topo.pair_gbps(a, b).tolist() == [150, 80, 50, 40, 40]
    matrix = topo.machine_bandwidth_matrix()
    assert np.array_equal(matrix, topo.pair_gbps(np.arange(4)[:, None], np.arange(4)[None, :]))
    assert topo.bandwidth_gbps(0, 2) == 50 and topo.bandwidth_gbps(1, 0) == 80 and topo.bandwidth_gbps(3, 3) == 64
    assert topo.machines[2].rack == "R1"  # as spelled; racks are matched case-insensitively
    assert parse_topology(topo.to_dict()) == topo
    racks, pods_ = h.uplink_capacity_gbps()
    assert racks.tolist() == [50, 25, 25] and pods_.tolist() == [30, 10]  # members * gbps / oversubscription


def test_flat_topologies_are_one_rack_and_keep_their_hash():
    flat = load_topology(TESTBED)
    assert "racks" not in flat.to_dict() and not flat.hierarchy.hierarchical
    assert set(flat.pair_level(np.arange(7)[:, None], np.arange(7)[None, :]).ravel().tolist()) == {0, 1}
    every = np.arange(flat.num_machines)
    assert np.array_equal(flat.pair_gbps(every[:, None], every[None, :]), flat.machine_bandwidth_matrix())
    racked = parse_topology(pods())
    assert racked.content_hash() != parse_topology(_edit(("uplinks", "rack", "oversubscription"), 3)).content_hash()


def test_contended_uplink_shares_its_capacity():
    uplink = Uplink(gbps=40, oversubscription=4)
    # 8 machines, capacity 8 * 40 / 4 = 80 Gbit/s: one flow gets 40, two 40, four 20, all eight 10 (= 40 / 4)
    assert uplink.flow_gbps(8, [1, 2, 4, 8]).tolist() == [40, 40, 20, 10]


def test_the_example_validates_on_the_command_line(capsys):
    assert main(["topology", "validate", str(TWO_RACKS)]) == 0
    out = capsys.readouterr().out
    assert "2 racks, 2 machines per rack" in out and "oversubscription 4:1, 20 µs" in out
    assert main(["topology", "validate", str(TWO_RACKS), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["topology"]["uplinks"]["rack"]["gbps"] == 100 and (summary["num_racks"], summary["num_pods"]) == (2, 1)


BAD = {
    "rack missing on one machine": (_edit(("machines", 2, "rack"), _DROP), "machines[2].rack", "every machine names its rack"),
    "unknown rack": (_edit(("machines", 3, "rack"), "r9"), "machines[3].rack", "unknown rack 'r9'"),
    "empty rack name": (_edit(("machines", 0, "rack"), " "), "machines[0].rack", "non-empty string"),
    "rack not a string": (_edit(("machines", 0, "rack"), 3), "machines[0].rack", "non-empty string"),
    "racks not a list": (pods(racks={"r0": "p0"}), "racks", "must be a list"),
    "rack without machines": (pods(racks=PODS["racks"] + [{"name": "r3", "pod": "p1"}]), "racks[3]", "no machine"),
    "duplicate rack": (pods(racks=PODS["racks"] + [{"name": "R0", "pod": "p1"}]), "racks[3].name", "duplicate rack"),
    "unknown rack key": (_edit(("racks", 1, "uplink"), 3), "racks[1].uplink", "unknown key"),
    "racks but no machine rack": (
        pods(machines=[{k: v for k, v in m.items() if k != "rack"} for m in PODS["machines"]]), "racks", "no machine"),
    "machine racks but no racks": (_edit(("racks",), _DROP), "racks", "missing required field"),
    "pod missing on one rack": (_edit(("racks", 2, "pod"), _DROP), "racks[2].pod", "every rack names its pod"),
    "no rack uplink": (_edit(("uplinks", "rack"), _DROP), "uplinks.rack", "missing required field"),
    "no pod uplink": (_edit(("uplinks", "pod"), _DROP), "uplinks.pod", "missing required field"),
    "pod uplink without pods": (
        pods(racks=[{"name": r["name"]} for r in PODS["racks"]]), "uplinks.pod", "needs pods"),
    "uplinks without racks": (
        pods(machines=[{k: v for k, v in m.items() if k != "rack"} for m in PODS["machines"]], racks=[]),
        "uplinks.rack", "needs racks"),
    "zero uplink gbps": (_edit(("uplinks", "rack", "gbps"), 0), "uplinks.rack.gbps", "positive"),
    "missing uplink gbps": (_edit(("uplinks", "pod", "gbps"), _DROP), "uplinks.pod.gbps", "missing required field"),
    "undersubscribed": (_edit(("uplinks", "rack", "oversubscription"), 0.5), "uplinks.rack.oversubscription",
                        "between 1 and 1e+06"),
    "string oversubscription": (_edit(("uplinks", "pod", "oversubscription"), "4:1"), "uplinks.pod.oversubscription",
                                "positive finite number"),
    "negative latency": (_edit(("uplinks", "rack", "latency_us"), -1), "uplinks.rack.latency_us", "positive"),
    "unknown uplink key": (_edit(("uplinks", "rack", "gpbs"), 1), "uplinks.rack.gpbs", "did you mean 'gbps'"),
    "unknown level": (_edit(("uplinks", "spine"), {"gbps": 1}), "uplinks.spine", "unknown key"),
    "link across racks": (pods(links=[{"a": "a0", "b": "b0", "gbps": 10}]), "links[0]", "across racks"),
    "matrix with racks": (pods(links=[], inter_gbps=[[0, 1, 1, 1], [1, 0, 1, 1], [1, 1, 0, 1], [1, 1, 1, 0]]),
                          "inter_gbps", "cannot be combined with racks"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_hierarchy_errors_name_the_field(case):
    data, where, problem = BAD[case]
    with pytest.raises(TagInputError) as err:
        parse_topology(data)
    assert err.value.where == where, str(err.value)
    assert problem in str(err.value) and "\n" not in str(err.value)


def test_bad_hierarchical_file_exits_2_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_edit(("uplinks", "rack", "oversubscription"), 0.5)))
    assert main(["topology", "validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tag: error: uplinks.rack.oversubscription: must be between 1 and") and err.count("\n") == 1


# ---------------------------------------------------------------- random --gpus


@pytest.mark.parametrize("gpus, racks, pods_", [(1, None, None), (13, 2, None), (100, 5, 2), (8192, 16, None)])
def test_random_of_a_size_has_exactly_that_many_gpus(gpus, racks, pods_):
    topo = sized_topology(4, gpus, racks, pods_)
    assert topo.num_devices == gpus and len(topo.gpu_types()) <= 3
    assert topo == sized_topology(4, gpus, racks, pods_)
    assert not topo.links
    if racks:
        sizes = topo.hierarchy.rack_machines
        assert len(sizes) == racks and sizes.max() - sizes.min() <= 1
    assert (topo.pod_uplink is not None) == (pods_ is not None)
    if gpus <= 100:
        assert parse_topology(topo.to_dict()) == topo


def test_big_random_cluster_falls_into_few_machine_kinds():
    topo = sized_topology(0, 8192, racks=16)
    kinds = {(m.gpu.name, m.count, m.intra_gbps) for m in topo.machines}
    assert len(topo.gpu_types()) == 3 and len(kinds) <= 4  # 3 types, and a last machine cut short


def test_cli_random_of_a_size(tmp_path, capsys):
    out = tmp_path / "big.json"
    assert main(["topology", "random", "--gpus", "2048", "--racks", "4", "--out", str(out)]) == 0
    assert "2048 devices" in capsys.readouterr().out
    topo = load_topology(out)
    assert topo == sized_topology(0, 2048, racks=4) and topo.hierarchy.num_racks == 4
    assert main(["topology", "validate", str(out)]) == 0
    assert "more machines (--json lists them all)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--racks", "2"], "--gpus: missing"),
    (["--gpus", "0"], "--gpus: must be a positive integer"),
    (["--gpus", "20000"], "--gpus: must be at most 16384"),
    (["--gpus", "8", "--racks", "5"], "--racks: must be at most"),
    (["--gpus", "64", "--pods", "2"], "--pods: needs --racks"),
    (["--gpus", "64", "--racks", "2", "--pods", "3"], "--pods: must be at most 2"),
    (["--gpus", "64", "--types", "9"], "--types: must be at most 5"),
])
def test_cli_random_refuses_bad_sizes(argv, message, capsys):
    assert main(["topology", "random", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
