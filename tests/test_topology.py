"""Topology snapshots, GPU catalog and the `tag topology` command (no TensorFlow needed)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tag_core.cli import main
from tag_core.cluster import (
    CATALOG,
    GpuType,
    Machine,
    Topology,
    load_topology,
    lookup_gpu,
    normalise_device_name,
    parse_topology,
    random_topology,
)
from tag_core.cluster.topology import RANDOM_GPU_POOL
from tag_core.errors import TagInputError

ROOT = Path(__file__).resolve().parents[1]
TESTBED = ROOT / "examples" / "topologies" / "testbed.json"
CLOUD = ROOT / "examples" / "topologies" / "cloud.json"

ISSUE_EXAMPLE = {
    "name": "testbed",
    "machines": [
        {"name": "v100-box", "gpu": "V100-32GB", "count": 4, "intra_gbps": 150},
        {"name": "gtx-a", "gpu": "GTX1080Ti", "count": 2, "intra_gbps": 64},
        {"name": "gtx-b", "gpu": "gtx1080ti", "count": 3, "intra_gbps": 80},
    ],
    "inter_gbps": 100,
    "links": [{"a": "v100-box", "b": "gtx-a", "gbps": 50}],
}


def example(**changes) -> dict:
    data = copy.deepcopy(ISSUE_EXAMPLE)
    data.update(changes)
    return data


# ---------------------------------------------------------------- catalog


def test_catalog_has_required_types_with_sane_figures():
    for name in ["V100-16GB", "V100-32GB", "P100-16GB", "GTX1080Ti", "T4", "A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "cpu"]:
        gpu = CATALOG[name]
        assert gpu.tflops > 0 and gpu.mem_gb > 0 and gpu.mem_bw_gbps > 0
    assert CATALOG["V100-32GB"].mem_gb == 32 and CATALOG["H200-141GB"].mem_gb == 141
    assert CATALOG["V100-16GB"].tflops == pytest.approx(15.7)  # FP32, not tensor-core FP16
    assert CATALOG["T4"].tflops < CATALOG["P100-16GB"].tflops < CATALOG["V100-16GB"].tflops < CATALOG["H100-80GB"].tflops
    assert CATALOG["A100-80GB"].mem_bw_gbps > CATALOG["A100-40GB"].mem_bw_gbps


def test_lookup_gpu_is_case_insensitive_and_rejects_unknown():
    assert lookup_gpu("v100-32gb") is CATALOG["V100-32GB"]
    assert lookup_gpu(" gtx1080ti ") is CATALOG["GTX1080Ti"]
    with pytest.raises(TagInputError) as err:
        lookup_gpu("RTX9090")
    assert "RTX9090" in str(err.value) and "V100-32GB" in str(err.value)


@pytest.mark.parametrize(
    "description, expected",
    [
        ("NVIDIA H200", "H200-141GB"),
        ("Tesla V100-SXM2-32GB", "V100-32GB"),
        ("Tesla V100-PCIE-16GB", "V100-16GB"),
        ("Tesla V100-SXM2", "V100-16GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("Tesla T4", "T4"),
        ("GeForce GTX 1080 Ti", "GTX1080Ti"),
        ("NVIDIA GeForce GTX 1080Ti", "GTX1080Ti"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("Tesla P100-PCIE-16GB", "P100-16GB"),
        ("device: 0, name: NVIDIA H200, pci bus id: 0000:00:05.0, compute capability: 9.0", "H200-141GB"),
        ("cpu", "cpu"),
        ("/device:CPU:0", "cpu"),
        ("GeForce GTX 1080", "geforce-gtx-1080"),  # not a Ti
        ("NVIDIA GH200 480GB", "nvidia-gh200-480gb"),  # not an H200 card
        ("NVIDIA RTX A6000", "nvidia-rtx-a6000"),
        ("", "unknown"),
    ],
)
def test_normalise_device_name(description, expected):
    assert normalise_device_name(description) == expected


# ---------------------------------------------------------------- examples and lookups


def test_examples_parse_with_expected_shapes():
    testbed = load_topology(TESTBED)
    assert testbed.num_devices == 16 and len(testbed.machines) == 7
    assert testbed.gpu_types() == {"V100-32GB": 4, "GTX1080Ti": 8, "P100-16GB": 4}
    assert testbed.inter_gbps == 100
    cloud = load_topology(CLOUD)
    assert cloud.num_devices == 32 and len(cloud.machines) == 6
    assert cloud.gpu_types() == {"V100-16GB": 16, "T4": 16}
    assert cloud.inter_gbps == 10


def test_devices_are_machine_major():
    topo = parse_topology(ISSUE_EXAMPLE)
    assert topo.num_devices == 9
    assert [(d.index, d.machine, d.local) for d in topo.devices[3:7]] == [(3, 0, 3), (4, 1, 0), (5, 1, 1), (6, 2, 0)]
    assert topo.devices[0].gpu is CATALOG["V100-32GB"]
    assert topo.devices[8].gpu is CATALOG["GTX1080Ti"]  # lower-case name resolved to the catalog entry
    assert topo.devices is topo.devices  # cached
    assert list(topo.device_machine) == [0] * 4 + [1] * 2 + [2] * 3


def test_bandwidth_lookups_and_link_overrides():
    topo = parse_topology(ISSUE_EXAMPLE)
    assert topo.bandwidth_gbps(0, 0) == 150
    assert topo.bandwidth_gbps(1, 1) == 64
    assert topo.bandwidth_gbps(0, 1) == 50 and topo.bandwidth_gbps(1, 0) == 50  # override, both directions
    assert topo.bandwidth_gbps(0, 2) == 100 and topo.bandwidth_gbps(1, 2) == 100  # inter_gbps
    mm = topo.machine_bandwidth_matrix()
    np.testing.assert_array_equal(mm, [[150, 50, 100], [50, 64, 100], [100, 100, 80]])
    dm = topo.device_bandwidth_matrix()
    assert dm.shape == (9, 9)
    np.testing.assert_array_equal(dm, dm.T)
    assert dm[0, 3] == 150 and dm[0, 0] == 150  # same machine, diagonal included
    assert dm[3, 4] == 50 and dm[5, 8] == 100 and dm[7, 8] == 80
    for i in range(9):
        for j in range(9):
            assert dm[i, j] == topo.bandwidth_gbps(topo.devices[i].machine, topo.devices[j].machine)
    with pytest.raises(ValueError):
        dm[0, 1] = 1.0  # shared cached array is read-only


def test_link_names_are_case_insensitive_and_stored_as_spelled():
    topo = parse_topology(example(links=[{"a": "GTX-B", "b": "V100-Box", "gbps": 25}]))
    assert topo.links == (("gtx-b", "v100-box", 25.0),)
    assert topo.bandwidth_gbps(0, 2) == 25


def test_inline_gpu_object():
    data = example()
    data["machines"][1]["gpu"] = {"name": "MyGPU", "tflops": 20, "mem_gb": 24, "mem_bw_gbps": 1000}
    data["machines"][2]["gpu"] = {"name": "MyGPU", "tflops": 20, "mem_gb": 24, "mem_bw_gbps": 1000}
    topo = parse_topology(data)
    assert topo.machines[1].gpu == GpuType("MyGPU", 20.0, 24.0, 1000.0)
    assert topo.gpu_types() == {"V100-32GB": 4, "MyGPU": 5}
    assert parse_topology(topo.to_dict()) == topo


def test_round_trip_and_hash():
    for topo in [parse_topology(ISSUE_EXAMPLE), load_topology(TESTBED), load_topology(CLOUD), random_topology(11)]:
        again = parse_topology(json.loads(json.dumps(topo.to_dict())))
        assert again == topo
        assert again.content_hash() == topo.content_hash()
    h = parse_topology(ISSUE_EXAMPLE).content_hash()
    assert len(h) == 16 and all(c in "0123456789abcdef" for c in h)
    # Link direction does not change the snapshot; a bandwidth does.
    flipped = example(links=[{"a": "gtx-a", "b": "v100-box", "gbps": 50}])
    assert parse_topology(flipped).content_hash() == h
    assert parse_topology(example(inter_gbps=101)).content_hash() != h
    assert parse_topology(example(inter_gbps=100.0)).content_hash() == h  # 100 and 100.0 are the same figure


def test_inter_gbps_as_a_per_pair_matrix():
    """One row per machine; the diagonal is ignored (intra_gbps holds there)."""
    matrix = [[0, 50, 100], [50, 0, 100], [100, 100, 0]]
    topo = parse_topology(example(inter_gbps=matrix, links=[]))
    assert topo == parse_topology(ISSUE_EXAMPLE)  # the same cluster as inter_gbps 100 with one link at 50
    np.testing.assert_array_equal(topo.machine_bandwidth_matrix(), [[150, 50, 100], [50, 64, 100], [100, 100, 80]])
    single = parse_topology(example(machines=ISSUE_EXAMPLE["machines"][:1], inter_gbps=[[0]], links=[]))
    assert single.num_devices == 4 and single.links == ()


def test_programmatic_construction_is_validated():
    v100 = CATALOG["V100-16GB"]
    Topology("ok", (Machine("a", v100, 2, 100.0),), 10.0)
    with pytest.raises(TagInputError, match=r"machines\[1\]\.name"):
        Topology("dup", (Machine("a", v100, 2, 100.0), Machine("A", v100, 1, 100.0)), 10.0)
    with pytest.raises(TagInputError, match=r"links\[0\]\.b"):
        Topology("bad", (Machine("a", v100, 2, 100.0),), 10.0, (("a", "zz", 5.0),))


# ---------------------------------------------------------------- validation errors


def _machine(i: int, **changes) -> dict:
    data = example()
    data["machines"][i].update(changes)
    return data


def _drop(data: dict, *path) -> dict:
    target = data
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return data


def _with_link(**link) -> dict:
    return example(links=[{"a": "v100-box", "b": "gtx-a", "gbps": 50, **link}])


BAD = {
    "duplicate name": (example(machines=ISSUE_EXAMPLE["machines"] + [{"name": "GTX-A", "gpu": "T4", "count": 1, "intra_gbps": 64}]), "machines[3].name", "duplicate"),
    "link to unknown machine": (_with_link(b="nowhere"), "links[0].b", "unknown machine 'nowhere'"),
    "link to itself": (_with_link(b="V100-BOX"), "links[0]", "itself"),
    "duplicate link": (example(links=[{"a": "v100-box", "b": "gtx-a", "gbps": 50}, {"a": "gtx-a", "b": "v100-box", "gbps": 40}]), "links[1]", "duplicate link"),
    "zero count": (_machine(2, count=0), "machines[2].count", "must be a positive integer"),
    "negative count": (_machine(0, count=-3), "machines[0].count", "must be a positive integer"),
    "float count": (_machine(0, count=2.0), "machines[0].count", "must be a positive integer"),
    "bool count": (_machine(1, count=True), "machines[1].count", "must be a positive integer"),
    "string count": (_machine(1, count="4"), "machines[1].count", "must be a positive integer"),
    "zero intra": (_machine(0, intra_gbps=0), "machines[0].intra_gbps", "positive"),
    "string intra": (_machine(0, intra_gbps="150"), "machines[0].intra_gbps", "positive"),
    "bool intra": (_machine(0, intra_gbps=False), "machines[0].intra_gbps", "positive"),
    "nan intra": (_machine(0, intra_gbps=float("nan")), "machines[0].intra_gbps", "finite"),
    "inf inter": (example(inter_gbps=float("inf")), "inter_gbps", "finite"),
    "negative inter": (example(inter_gbps=-1), "inter_gbps", "positive"),
    "negative link": (_with_link(gbps=-5), "links[0].gbps", "positive"),
    "unknown gpu": (_machine(1, gpu="RTX9090"), "machines[1].gpu", "unknown GPU type 'RTX9090'"),
    "gpu wrong type": (_machine(1, gpu=7), "machines[1].gpu", "catalog GPU name or an object"),
    "inline gpu missing field": (_machine(1, gpu={"name": "X", "tflops": 1, "mem_gb": 8}), "machines[1].gpu.mem_bw_gbps", "missing"),
    "inline gpu bad number": (_machine(1, gpu={"name": "X", "tflops": "fast", "mem_gb": 8, "mem_bw_gbps": 100}), "machines[1].gpu.tflops", "positive"),
    "inline gpu conflicting specs": (
        example(machines=[
            {"name": "a", "gpu": {"name": "X", "tflops": 1, "mem_gb": 8, "mem_bw_gbps": 100}, "count": 1, "intra_gbps": 64},
            {"name": "b", "gpu": {"name": "x", "tflops": 2, "mem_gb": 8, "mem_bw_gbps": 100}, "count": 1, "intra_gbps": 64},
        ], links=[]),
        "machines[1].gpu", "differs",
    ),
    "missing count": (_drop(example(), "machines", 2, "count"), "machines[2].count", "missing required field"),
    "missing inter": (_drop(example(), "inter_gbps"), "inter_gbps", "missing required field"),
    "missing name": (_drop(example(), "name"), "name", "missing required field"),
    "missing link gbps": (_drop(_with_link(), "links", 0, "gbps"), "links[0].gbps", "missing required field"),
    "empty machines": (example(machines=[], links=[]), "machines", "at least one"),
    "machines not a list": (example(machines={"a": 1}), "machines", "must be a list"),
    "machine not an object": (example(machines=["v100-box"], links=[]), "machines[0]", "must be a JSON object"),
    "links not a list": (example(links={"a": "x"}), "links", "must be a list"),
    "empty machine name": (_machine(0, name="  "), "machines[0].name", "non-empty string"),
    "unknown top-level key": (example(machine=[]), "machine", "unknown key"),
    "unknown machine key": (_machine(0, gpus=4), "machines[0].gpus", "unknown key"),
    "unknown link key": (_with_link(bandwidth=3), "links[0].bandwidth", "unknown key"),
    "tiny bandwidth": (_machine(0, intra_gbps=1e-300), "machines[0].intra_gbps", "between 1e-09 and 1e+07 Gbit/s"),
    "huge link": (_with_link(gbps=1e300), "links[0].gbps", "between"),
    "huge inline gpu": (_machine(1, gpu={"name": "X", "tflops": 1e300, "mem_gb": 8, "mem_bw_gbps": 100}), "machines[1].gpu.tflops", "between"),
    "huge count": (_machine(1, count=100_000_000_000), "machines[1].count", "at most 1024"),
    "too many gpus": (example(machines=[{"name": f"m{i}", "gpu": "T4", "count": 1024, "intra_gbps": 64} for i in range(17)], links=[]), "machines", "at most 16384"),
    "inline gpu with a catalog name": (_machine(1, gpu={"name": "v100-32gb", "tflops": 1, "mem_gb": 8, "mem_bw_gbps": 100}), "machines[1].gpu.name", "catalog GPU with other figures"),
    "matrix and links": (example(inter_gbps=[[0, 50, 100], [50, 0, 100], [100, 100, 0]]), "links", "cannot be combined"),
    "matrix too small": (example(inter_gbps=[[0, 50], [50, 0]], links=[]), "inter_gbps", "3x3"),
    "matrix ragged": (example(inter_gbps=[[0, 50, 1], [50, 0], [1, 1, 0]], links=[]), "inter_gbps", "3x3"),
    "matrix not symmetric": (example(inter_gbps=[[0, 50, 100], [40, 0, 100], [100, 100, 0]], links=[]), "inter_gbps[1][0]", "must equal inter_gbps[0][1] (50)"),
    "matrix zero entry": (example(inter_gbps=[[0, 0, 100], [0, 0, 100], [100, 100, 0]], links=[]), "inter_gbps[0][1]", "positive"),
    "matrix string entry": (example(inter_gbps=[[0, 50, "x"], [50, 0, 100], ["x", 100, 0]], links=[]), "inter_gbps[0][2]", "positive"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_validation_errors_name_the_field(case):
    data, where, problem = BAD[case]
    with pytest.raises(TagInputError) as err:
        parse_topology(data)
    assert err.value.where == where, str(err.value)
    assert str(err.value).startswith(f"{where}: ")
    assert problem in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(TagInputError, match="did you mean 'machines'"):
        parse_topology(example(machine=[]))


@pytest.mark.parametrize("top", [[], "x", 3, None])
def test_top_level_must_be_an_object(top):
    with pytest.raises(TagInputError) as err:
        parse_topology(top, source="snap.json")
    assert err.value.where == "snap.json" and "JSON object" in err.value.problem


@pytest.mark.parametrize("text, problem", [
    ('{"name": "a", "name": "b", "machines": [], "inter_gbps": 1}', "key 'name' appears twice"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_ambiguous_or_pathological_json_is_refused(tmp_path, text, problem):
    path = tmp_path / "snap.json"
    path.write_text(text)
    with pytest.raises(TagInputError) as err:
        load_topology(path)
    assert err.value.where == str(path) and problem in err.value.problem


def test_load_topology_file_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(TagInputError) as err:
        load_topology(missing)
    assert err.value.where == str(missing)
    broken = tmp_path / "broken.json"
    broken.write_text('{"name": "x", ')
    with pytest.raises(TagInputError) as err:
        load_topology(broken)
    assert err.value.where == str(broken) and "not valid JSON" in err.value.problem
    nan = tmp_path / "nan.json"
    nan.write_text(json.dumps(example()).replace('"inter_gbps": 100', '"inter_gbps": NaN'))
    with pytest.raises(TagInputError) as err:
        load_topology(nan)
    assert err.value.where == "inter_gbps" and "NaN" in err.value.problem and str(nan) in err.value.problem


# ---------------------------------------------------------------- random topologies


def test_random_topology_is_deterministic():
    assert random_topology(7) == random_topology(7)
    assert random_topology(7).content_hash() == random_topology(7).content_hash()
    hashes = {random_topology(s).content_hash() for s in range(50)}
    assert len(hashes) == 50


def test_random_topology_follows_the_paper_distribution():
    machine_counts, gpu_counts, types_seen, with_links = set(), set(), set(), 0
    for seed in range(400):
        topo = random_topology(seed)
        assert 1 <= len(topo.machines) <= 6
        assert len(topo.gpu_types()) <= 3
        assert 20 <= topo.inter_gbps <= 50
        for m in topo.machines:
            assert 1 <= m.count <= 8
            assert 64 <= m.intra_gbps <= 160
            assert m.gpu.name in RANDOM_GPU_POOL
        for _, _, gbps in topo.links:
            assert 20 <= gbps <= 50
        machine_counts.add(len(topo.machines))
        gpu_counts.update(m.count for m in topo.machines)
        types_seen.update(topo.gpu_types())
        with_links += bool(topo.links)
        assert parse_topology(topo.to_dict()) == topo  # generator output passes validation
    assert machine_counts == set(range(1, 7))
    assert gpu_counts == set(range(1, 9))
    assert types_seen == set(RANDOM_GPU_POOL)
    assert with_links > 0
    assert any(len(random_topology(s).gpu_types()) == 3 for s in range(400))


# ---------------------------------------------------------------- CLI


def test_cli_validate_summary(capsys):
    assert main(["topology", "validate", str(TESTBED)]) == 0
    out = capsys.readouterr().out
    topo = load_topology(TESTBED)
    assert "testbed" in out and topo.content_hash() in out
    assert "7 machines, 16 devices" in out and "100 Gbps" in out
    for name in ["v100-box", "gtx-d", "p100-b", "V100-32GB", "GTX1080Ti", "P100-16GB"]:
        assert name in out
    assert len(out.splitlines()) <= 25  # one screen


def test_cli_validate_json(capsys):
    assert main(["topology", "validate", str(CLOUD), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["num_devices"] == 32 and data["num_machines"] == 6
    assert data["gpu_types"] == {"V100-16GB": 16, "T4": 16}
    assert parse_topology(data["topology"]) == load_topology(CLOUD)
    assert data["hash"] == load_topology(CLOUD).content_hash()


def test_cli_validate_bad_file_exits_2_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_machine(2, count=0)))
    assert main(["topology", "validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == "tag: error: machines[2].count: must be a positive integer, got int 0\n"
    assert main(["topology", "validate", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.json" in err


def test_cli_random_prints_and_writes(tmp_path, capsys):
    assert main(["topology", "random", "--seed", "5"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert parse_topology(printed) == random_topology(5)
    out = tmp_path / "r5.json"
    assert main(["topology", "random", "--seed", "5", "--out", str(out)]) == 0
    assert load_topology(out) == random_topology(5)
    assert [p.name for p in tmp_path.iterdir()] == ["r5.json"]  # no temp file left behind
    assert main(["topology", "random", "--seed", "5", "--out", str(tmp_path / "no" / "dir.json")]) == 2


def test_cli_subprocess_exit_code():
    proc = subprocess.run(
        [sys.executable, "-m", "tag_core.cli", "topology", "validate", str(ROOT / "does-not-exist.json")],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("tag: error: ")
    assert proc.stdout == ""


def test_modules_do_not_import_tensorflow():
    code = "import sys, tag_core.cluster.topology, tag_core.cluster.gpu_catalog, tag_core.cli.topology; print('tensorflow' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr
