"""`tag topology probe` and `discover` on recorded outputs of the real tools (tests/data/probes/, each folder's
SOURCE.md names where they were published) and on this machine itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tag_core.cluster.probe.discover import merge, read_probes
from tag_core.cluster.probe.links import pair_gbps, ring_gbps
from tag_core.cluster.probe.machine import probe
from tag_core.cluster.probe.network import parse_ibstat, parse_net_speeds
from tag_core.cluster.probe.nvidia_smi import parse_smi_table, parse_topology_matrix
from tag_core.cluster.topology_json import parse_topology
from tag_core.errors import TagInputError

ROOT = Path(__file__).resolve().parents[1]
PROBES = ROOT / "tests" / "data" / "probes"


def topo(folder: str):
    return parse_topology_matrix((PROBES / folder / "nvidia-smi-topo-m.txt").read_text())


def tag(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tag_core.cli", "topology", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)


def test_a_dgx1_cube_mesh_joins_some_pairs_by_nvlink_and_not_others() -> None:
    matrix = topo("dgx1")
    assert matrix.gpus == [f"GPU{i}" for i in range(8)] and matrix.nics == ["mlx5_0"]
    assert matrix.between("GPU0", "GPU3") == "NV2" and matrix.between("GPU0", "GPU1") == "NV1"
    assert matrix.between("GPU0", "GPU5") == "SYS" and matrix.between("GPU2", "mlx5_0") == "PIX"
    v100 = "Tesla V100-SXM2-16GB"
    assert pair_gbps("NV2", v100, v100) == 400 and pair_gbps("SYS", v100, v100) == pytest.approx(126 * 0.4)
    # The best ring uses only the doubled links (0-3-2-1-5-6-7-4): what a ring all-reduce gets.
    bandwidth = {(a, b): pair_gbps(matrix.between(f"GPU{a}", f"GPU{b}"), v100, v100)
                 for a in range(8) for b in range(a + 1, 8)}
    assert ring_gbps(bandwidth, list(range(8))) == 400


@pytest.mark.parametrize("folder,links,gpu,gbps", [("hgx-a100", "NV12", "NVIDIA A100-SXM4-40GB", 2400),
                                                    ("hgx-b200", "NV18", "NVIDIA B200", 3600)])
def test_nvswitch_systems_join_every_pair_alike(folder: str, links: str, gpu: str, gbps: float) -> None:
    matrix = topo(folder)
    assert len(matrix.gpus) == 8 and len(matrix.nics) >= 8
    assert {matrix.between(a, b) for a in matrix.gpus for b in matrix.gpus if a != b} == {links}
    assert pair_gbps(links, gpu, gpu) == gbps


@pytest.mark.parametrize("folder,cell,gpu,gbps", [("pcie-mixed", "SYS", "NVIDIA A10", 252 * 0.4),
                                                  ("pcie-2x1080ti", "PHB", "GeForce GTX 1080 Ti", 126 * 0.75)])
def test_pcie_boxes_get_their_path_class(folder: str, cell: str, gpu: str, gbps: float) -> None:
    matrix = topo(folder)
    assert {matrix.between(a, b) for a in matrix.gpus for b in matrix.gpus if a != b} == {cell}
    assert pair_gbps(cell, gpu, gpu) == pytest.approx(gbps)


def test_gpu_tables_and_infiniband_rates() -> None:
    h100 = parse_smi_table((PROBES / "dgx-h100" / "nvidia-smi.txt").read_text())
    assert len(h100) == 8 and h100[0].name == "NVIDIA H100 80GB HBM3" and h100[0].memory_mib == 81559
    p100 = parse_smi_table((PROBES / "dgx1" / "nvidia-smi.txt").read_text())
    assert [g.bus_id for g in p100][:2] == ["00000000:04:00.0", "00000000:05:00.0"]
    (port,) = parse_ibstat((PROBES / "dgx1" / "ibstat.txt").read_text())
    assert (port.name, port.kind, port.gbps) == ("mlx5_0/1", "infiniband", 100)
    nics = parse_net_speeds("/sys/class/net/eth0/speed:25000\n/sys/class/net/lo/speed:-1\n/sys/class/net/ib0/speed:-1")
    assert [(n.name, n.gbps) for n in nics] == [("eth0", 25), ("ib0", None)]


def recorded(tmp_path: Path, *files: tuple[str, str]) -> Path:
    folder = tmp_path / "recorded"
    folder.mkdir()
    for source, name in files:
        shutil.copy(PROBES / source, folder / name)
    return folder


def test_a_recorded_dgx1_class_box_probes_to_one_machine(tmp_path: Path) -> None:
    # The cube-mesh matrix and the GPU table come from two DGX-1-class boxes (dgx1/SOURCE.md): the V100 box's
    # table was never published. Its P100s take NVLink 1's rate.
    folder = recorded(tmp_path, ("dgx1/nvidia-smi-topo-m.txt", "nvidia-smi-topo-m.txt"),
                      ("dgx1/nvidia-smi.txt", "nvidia-smi.txt"), ("dgx1/ibstat.txt", "ibstat.txt"))
    result = probe(folder)
    assert result["machines"] == [{"name": "recorded", "gpu": "P100-16GB", "count": 8, "intra_gbps": 320.0}]
    pairs = {(p["a"], p["b"]): p["class"] for p in result["pairs"]}
    assert pairs[("GPU0", "GPU3")] == "NV2" and pairs[("GPU0", "GPU5")] == "SYS"
    assert result["nics"] == [{"name": "mlx5_0/1", "kind": "infiniband", "gbps": 100.0}]
    topology, nominal = merge([result], "dgx1")
    assert parse_topology(topology).num_devices == 8 and topology["inter_gbps"] == 100
    assert any("intra_gbps" in line for line in nominal)


def test_a_gpu_list_without_its_connections_is_one_line(tmp_path: Path) -> None:
    folder = recorded(tmp_path, ("dgx-h100/nvidia-smi.txt", "nvidia-smi.txt"))
    done = tag("probe", "--recorded", str(folder))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1].endswith(
        f"nvidia-smi topo -m: no output (recorded in {folder}): GPUs are listed, but not how they connect")


def test_an_unknown_gpu_says_how_to_add_it_and_then_probes(tmp_path: Path) -> None:
    folder = recorded(tmp_path, ("hgx-b200/nvidia-smi-topo-m.txt", "nvidia-smi-topo-m.txt"))
    (folder / "nvidia-smi-L.txt").write_text("".join(f"GPU {i}: NVIDIA B200 (UUID: GPU-{i})\n" for i in range(8)))
    done = tag("probe", "--recorded", str(folder))
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert "nvidia-smi: GPU 0 is a 'NVIDIA B200', which the catalog does not know; give its figures with --catalog" in line
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps({"NVIDIA B200": {"name": "B200", "tflops": 80, "mem_gb": 180, "mem_bw_gbps": 8000}}))
    out = tmp_path / "b200.json"
    done = tag("probe", "--recorded", str(folder), "--catalog", str(catalog), "--out", str(out))
    assert done.returncode == 0, done.stderr
    (machine,) = json.loads(out.read_text())["machines"]
    assert machine["gpu"]["name"] == "B200" and machine["count"] == 8 and machine["intra_gbps"] == 3600


@pytest.mark.parametrize("damage,expected", [
    (lambda text: text.split("GPU4    NV2")[0], "nvidia-smi topo -m: no row for GPU4, GPU5, GPU6, GPU7, mlx5_0"),
    (lambda text: text.replace("GPU1    NV1      X      NV2", "GPU1    NV1      X      NVX"),
     "nvidia-smi topo -m: line 3: GPU1/GPU2: unknown connection 'NVX'"),
    (lambda text: text.replace("GPU2    NV1     NV2      X      NV2     SYS     SYS     NV1     SYS     PIX",
                               "GPU2    NV1     NV2      X"), "nvidia-smi topo -m: line 4: 3 entries for 9 devices"),
    (lambda text: "\n".join(text.splitlines()[1:]), "nvidia-smi topo -m: no header line starting with GPU0"),
])
def test_malformed_outputs_name_the_tool_and_the_line(tmp_path: Path, damage, expected: str) -> None:
    folder = recorded(tmp_path, ("dgx1/nvidia-smi.txt", "nvidia-smi.txt"))
    (folder / "nvidia-smi-topo-m.txt").write_text(damage((PROBES / "dgx1" / "nvidia-smi-topo-m.txt").read_text()))
    out = tmp_path / "probe.json"
    done = tag("probe", "--recorded", str(folder), "--out", str(out))
    assert done.returncode == 2 and not out.exists()
    assert expected in done.stderr.strip().splitlines()[-1]
    with pytest.raises(TagInputError):
        probe(folder)


@pytest.mark.slow
def test_this_machine_probes_and_discovers_a_valid_topology(tmp_path: Path) -> None:
    probes = tmp_path / "probes"
    probes.mkdir()
    done = tag("probe", "--out", str(probes / "here.json"))
    assert done.returncode == 0, done.stderr
    here = json.loads((probes / "here.json").read_text())
    assert here["machines"] and all(m["count"] >= 1 for m in here["machines"])
    assert isinstance(here["nics"], list)
    checked = tag("validate", str(probes / "here.json"))  # the probe itself validates, as a one-host topology
    assert checked.returncode == 0 and "a probe: checked as the topology" in checked.stdout, checked.stderr
    shutil.copy(probes / "here.json", probes / "dgx.json")
    dgx = probe(recorded(tmp_path, ("dgx1/nvidia-smi-topo-m.txt", "nvidia-smi-topo-m.txt"),
                         ("dgx1/nvidia-smi.txt", "nvidia-smi.txt"), ("dgx1/ibstat.txt", "ibstat.txt")))
    (probes / "dgx.json").write_text(json.dumps(dgx))
    out = tmp_path / "cluster.json"
    done = tag("discover", "--probes", str(probes), "--out", str(out), "--name", "mixed")
    assert done.returncode == 0, done.stderr
    assert "nominal figures" in done.stdout
    assert tag("validate", str(out)).returncode == 0
    assert len(read_probes(probes)) == 2


def test_discover_refuses_what_is_not_a_probe(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"name": "not a probe"}')
    out = tmp_path / "out.json"
    done = tag("discover", "--probes", str(tmp_path), "--out", str(out))
    assert done.returncode == 2 and not out.exists()
    assert done.stderr.strip().splitlines()[-1].endswith("a.json: not a probe of version 1 (from `tag topology probe`)")


@pytest.mark.slow
def test_diff_says_in_words_what_changed(tmp_path: Path) -> None:
    old = {"name": "lab", "inter_gbps": 100, "machines": [
        {"name": "a", "gpu": "V100-16GB", "count": 8, "intra_gbps": 400},
        {"name": "b", "gpu": "T4", "count": 4, "intra_gbps": 64}], "links": [{"a": "a", "b": "b", "gbps": 50}]}
    new = {"name": "lab", "inter_gbps": 25, "machines": [
        {"name": "a", "gpu": "V100-16GB", "count": 7, "intra_gbps": 400},
        {"name": "c", "gpu": "A100-40GB", "count": 8, "intra_gbps": 2400}]}
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    done = tag("diff", str(tmp_path / "old.json"), str(tmp_path / "new.json"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "machine b is gone (4 x T4)", "machine a: 8 -> 7 GPUs (1 lost)", "machine c is new (8 x A100-40GB)",
        "between machines: 100 Gbit/s -> 25 Gbit/s", "link a <-> b is gone (was 50 Gbit/s)"]
    assert tag("diff", str(tmp_path / "old.json"), str(tmp_path / "old.json")).stdout == "no change\n"
    assert tag("diff", str(tmp_path / "old.json"), str(tmp_path / "none.json")).returncode == 2
