"""`tag topology discover --slurm` and `--kubernetes` on the published outputs of the real tools
(tests/data/probes/slurm and kubernetes, with their SOURCE.md), and a plan on the racks Slurm names."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from simgraphs import profiles, train_graph
from test_rack_planning import _best_cross_rack_time, _gradient_racks

from tag_core.cluster.probe.kubernetes import read_nodes
from tag_core.cluster.probe.slurm import expand_hostlist, parse_gres, parse_hostnames, parse_switches, read
from tag_core.cluster.topology_json import load_topology
from tag_core.errors import TagInputError
from tag_core.plan.planner import plan
from tag_core.search.mcts import Budget
from tag_core.simulate import Simulator, Strategy

ROOT = Path(__file__).resolve().parents[1]
SLURM = ROOT / "tests" / "data" / "probes" / "slurm"
KUBERNETES = ROOT / "tests" / "data" / "probes" / "kubernetes" / "gfd-readme-nodes-elided.yaml.txt"


def tag(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tag_core.cli", "topology", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)


def gpus(text: str) -> dict[str, tuple[str | None, int]]:
    return {host: (g.gpu_type, g.count) for host, g in parse_gres(text).items()}


def test_gres_from_the_sinfo_tables_and_scontrol_records_of_a_real_cluster() -> None:
    used = gpus((SLURM / "sinfo-gres-used.txt").read_text())  # GRES and GRES_USED columns, NODELIST last
    assert len(used) == 13 and used["hpc3-gpu-16-02"] == ("V100", 4)  # 3 of its 4 in use: still 4 GPUs
    assert used["hpc3-gpu-18-03"] == ("A30", 4) and used["hpc3-gpu-l54-03"] == ("A100", 2)
    one = {"hpc3-gpu-16-00": ("V100", 4)}
    assert gpus((SLURM / "sinfo-node-gres.txt").read_text()) == one
    record = (SLURM / "scontrol-show-node.txt").read_text()
    assert gpus(record) == one  # as the docs print it, continuation lines flush left...
    indented = "\n".join(line if line.startswith("NodeName=") else "   " + line for line in record.splitlines())
    assert gpus(indented + "\n\n" + record.replace("hpc3-gpu-16-00", "hpc3-gpu-16-01")) == {  # ...and as scontrol does
        "hpc3-gpu-16-00": ("V100", 4), "hpc3-gpu-16-01": ("V100", 4)}
    # Every node twice (once a partition), all without GPUs.
    assert gpus((SLURM / "sinfo-N-features-gres.txt").read_text()) == {}


def test_a_node_list_cut_at_the_column_width_is_one_line() -> None:
    with pytest.raises(TagInputError, match=r"^sinfo: line 2: unbalanced brackets in 'hpc3-15-\[00-19,21' "
                                            r"\(cut off at the column's width\? widen %N or %G"):
        parse_gres((SLURM / "sinfo-features-gres.txt").read_text())
    gpu_rows = [line for line in (SLURM / "sinfo-features-gres.txt").read_text().splitlines()
                if "gpu:" in line and line.split()[0].count("[") == line.split()[0].count("]")]
    header = "NODELIST CPUS MEMORY AVAIL_FEATURES GRES\n"
    with pytest.raises(TagInputError, match=r"^sinfo: line 9: GRES 'gpu:RTX600' has no GPU count"):
        parse_gres(header + "\n".join(gpu_rows))  # its last row's GRES is cut too
    assert gpus(header + "\n".join(gpu_rows[:2])) == {"hpc3-gpu-18-00": ("V100", 4), "hpc3-gpu-k54-00": ("A30", 4)}
    with pytest.raises(TagInputError, match=r"^sinfo: line 1: the table has no GRES column"):
        parse_gres("NODELIST CPUS\nnode01 40\n")
    with pytest.raises(TagInputError, match=r"^sinfo: line 2: hpc3-gpu-16-00 is listed again with other GPUs"):
        parse_gres("hpc3-gpu-16-00 gpu:V100:4\nhpc3-gpu-16-00 gpu:V100:2\n")


def test_gres_fields_and_host_list_syntax() -> None:
    assert expand_hostlist("node[01-03,07],gpu5") == ["node01", "node02", "node03", "node07", "gpu5"]
    with pytest.raises(ValueError, match="unbalanced"):
        expand_hostlist("node[01-03")
    lines = "node01 gpu:v100:4(S:0-1)\nnode02 (null)\nnode03 gpu:2,mps:100\nnode04 gpu:a100:2(S:0,1),gpu:a100:2\n"
    assert gpus(lines) == {"node01": ("v100", 4), "node03": (None, 2), "node04": ("a100", 4)}
    with pytest.raises(TagInputError, match=r"^sinfo: line 1: GRES 'gpu:v100' has no GPU count"):
        parse_gres("node01 gpu:v100")
    with pytest.raises(TagInputError, match=r"^sinfo: line 1: GRES .* mixes GPU types on one node"):
        parse_gres("node01 gpu:a100:2,gpu:v100:2")


def test_slurm_without_its_tools_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[01-02]")
    with pytest.raises(TagInputError, match=r"^scontrol: not found on PATH: --slurm runs inside a Slurm allocation"):
        read(None, None)


def test_scontrol_host_lists_as_the_real_tool_prints_them() -> None:
    # scontrol repeats a host given twice (xx[1-4,3]); a host is one machine.
    assert parse_hostnames((SLURM / "scontrol-show-hostnames-dup.txt").read_text()) == ["xx1", "xx2", "xx3", "xx4"]
    assert (SLURM / "scontrol-show-hostnames-2d.txt").read_text().split() == expand_hostlist("r[1-2]n[1-2]")


def test_blocks_of_a_gb200_cluster_are_racks() -> None:
    racks = parse_switches((SLURM / "scontrol-show-topology-block.txt").read_text())
    assert len(racks) == 180 and len(set(racks.values())) == 10
    assert racks["slurm-compute-node-000"] == racks["slurm-compute-node-017"] == "block01"
    assert racks["slurm-compute-node-018"] == "block02" and racks["slurm-compute-node-179"] == "block10"
    tree = "SwitchName=s0 Level=0 LinkSpeed=1 Nodes=tux[0-1]\nSwitchName=s1 Level=0 LinkSpeed=1 Nodes=tux[2-3]\n" \
           "SwitchName=s2 Level=1 LinkSpeed=1 Switches=s[0-1]\n"  # the tree form (Slurm's topology.conf docs)
    assert parse_switches(tree) == {"tux0": "s0", "tux1": "s0", "tux2": "s1", "tux3": "s1"}
    with pytest.raises(TagInputError, match=r"^scontrol show topology: line 1: neither a `SwitchName=… Level=…`"):
        parse_switches("Topology plugin not configured\n")


@pytest.mark.slow
def test_a_mixed_slurm_allocation_discovers_and_validates(tmp_path: Path) -> None:
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    shutil.copy(SLURM / "sinfo-gres-used.txt", recorded / "sinfo-gres.txt")
    out = tmp_path / "hpc3.json"
    done = tag("discover", "--slurm", "--recorded", str(recorded), "--nodelist",
               "hpc3-gpu-16-00,hpc3-gpu-18-03,hpc3-gpu-l54-03,hpc3-14-00", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "3 hosts, 3 machines, 10 devices (1 hosts without GPUs left out)" in done.stdout
    machines = {m["name"]: (m["gpu"], m["count"]) for m in json.loads(out.read_text())["machines"]}
    assert machines == {"hpc3-gpu-16-00": ("V100-16GB", 4), "hpc3-gpu-18-03": ("A30", 4),
                        "hpc3-gpu-l54-03": ("A100-40GB", 2)}
    assert tag("validate", str(out)).returncode == 0
    # Without its hosts, or with an unknown GPU type: one line, nothing written.
    (recorded / "sinfo-gres.txt").write_text("hpc3-gpu-m54-00 gpu:RTX6000:4\n")
    out.unlink()
    done = tag("discover", "--slurm", "--recorded", str(recorded), "--nodelist", "hpc3-gpu-m54-00", "--out", str(out))
    assert done.returncode == 2 and not out.exists()
    assert "'RTX6000', which the catalog does not know; give its figures with --catalog" in done.stderr
    done = tag("discover", "--slurm", "--recorded", str(recorded), "--out", str(out))
    assert done.returncode == 2 and "has no scontrol-show-hostnames.txt" in done.stderr and not out.exists()


# The real part is Crusoe's block topology; the GRES lines are the test's own (that README prints none), two
# V100s a host as in tests/test_rack_planning.py, so the planner faces the same choice on racks Slurm named.
NODELISTS = {"packed": "slurm-compute-node-[016-019]", "interleaved": "slurm-compute-node-[000,018,001,019]"}


def _slurm_racks(tmp_path: Path, nodelist: str, uplink_gbps: float, oversubscription: float):
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    shutil.copy(SLURM / "scontrol-show-topology-block.txt", recorded / "scontrol-show-topology.txt")
    hosts = expand_hostlist(nodelist)
    (recorded / "sinfo-gres.txt").write_text("".join(f"{host} gpu:v100:2(S:0-1)\n" for host in hosts))
    out = tmp_path / "blocks.json"
    done = tag("discover", "--slurm", "--recorded", str(recorded), "--nodelist", nodelist, "--inter-gbps", "100",
               "--uplink-gbps", str(uplink_gbps), "--oversubscription", str(oversubscription), "--out", str(out))
    assert done.returncode == 0, done.stderr
    validated = tag("validate", str(out))
    assert validated.returncode == 0, validated.stderr
    topology = load_topology(out)
    assert [m.rack for m in topology.machines] == [racks for racks in (
        ["block01", "block01", "block02", "block02"] if "016" in nodelist else ["block01", "block02"] * 2)]
    return topology


@pytest.mark.parametrize("order", sorted(NODELISTS))
@pytest.mark.slow
def test_a_plan_on_slurm_blocks_keeps_large_gradients_inside_one_block(tmp_path: Path, order: str) -> None:
    topology = _slurm_racks(tmp_path, NODELISTS[order], uplink_gbps=1.0, oversubscription=8.0)
    g = train_graph(weight_bytes=40_000_000, layers=2)
    prof = profiles(g, topology.machines[0].gpu.name, per_sample_us=2000.0)
    result = plan(g, topology, prof, budget=Budget(iterations=30), seed=0, sfb=False)
    sim = Simulator(g, topology, prof)
    everywhere = Strategy.uniform(len(g.ops), topology.num_machines, topology.num_devices, "allreduce")
    assert _gradient_racks(g, topology, everywhere) == [{0, 1}, {0, 1}]
    racks = _gradient_racks(g, topology, result.strategy)
    assert result.one_device is None and len(racks) == len(g.variables)
    assert all(len(r) == 1 for r in racks), racks
    assert len(np.flatnonzero(result.strategy.masks.any(axis=0))) >= 2
    assert result.time_s < _best_cross_rack_time(sim, len(g.ops))
    assert result.time_s < result.baselines["dp_nccl"]


@pytest.mark.slow
def test_kubernetes_gpu_feature_discovery_labels(tmp_path: Path) -> None:
    # GFD's README elides parts of the node with `...` lines: not YAML, and said so with its line.
    with pytest.raises(TagInputError, match=r"^kubectl get nodes \(.*\): not JSON, and not YAML: line 8: "):
        read_nodes(KUBERNETES)
    labels = "\n".join(line for line in KUBERNETES.read_text().splitlines() if line.strip() != "...")
    elided = tmp_path / "elided.yaml"
    elided.write_text(labels)
    with pytest.raises(TagInputError, match=r"items\[0\]: a node without metadata.name"):
        read_nodes(elided)  # the name went with the elision
    # The README's labels on a named node, beside a node without GPUs and with zone and rack labels.
    listed = tmp_path / "nodes.yaml"
    places = "      topology.kubernetes.io/zone: zone-a\n      topology.kubernetes.io/rack: r7\n"
    listed.write_text(labels.replace("  metadata:\n", "  metadata:\n    name: dgx2h\n").replace(
        "    labels:\n", "    labels:\n" + places)
        + "\n- apiVersion: v1\n  kind: Node\n  metadata:\n    name: cpu-node\n    labels: {kubernetes.io/os: linux}\n")
    out = tmp_path / "k8s.json"
    done = tag("discover", "--kubernetes", str(listed), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "1 hosts, 1 machines, 1 devices (1 nodes without GPUs left out)" in done.stdout
    topology = json.loads(out.read_text())
    assert topology["machines"] == [{"name": "dgx2h", "gpu": "A100-40GB", "count": 1, "intra_gbps": pytest.approx(
        topology["machines"][0]["intra_gbps"]), "rack": "r7"}]
    assert tag("validate", str(out)).returncode == 0
    as_json = tmp_path / "nodes.json"
    import yaml

    as_json.write_text(json.dumps(yaml.safe_load(listed.read_text())))
    assert [(n.name, n.product, n.count, n.memory_mib, n.zone, n.rack) for n in read_nodes(as_json)[0]] == [
        ("dgx2h", "A100-SXM4-40GB", 1, 39538.0, "zone-a", "r7")]
