"""Emitted graphs on TF's distributed runtime (local servers): each must compute the single-device step.

Every run happens in a child process under a timeout; tests that run collectives carry a pytest timeout too.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tag_core.capture import resolve_model
from tag_core.cli import main
from tag_core.cluster import parse_topology
from tag_core.emit import emit, write_emission
from tag_core.plan import make_groups
from tag_core.runtime import run_emitted
from tag_core.runtime.supervisor import _supervise
from tag_core.simulate import OPTIONS, Strategy

MODELS = {
    "mlp": "mlp[features=12,hidden=16]",
    "small_cnn": "small_cnn[image_size=8]",
    # layers=1 is one encoder and one decoder block: two layers with LayerNorm and attention.
    "transformer": "transformer[layers=1,d_model=32,heads=2,ff=64,vocab=50,seq_len=8]",
}
BATCH = 8
UNEVEN = np.array([1.0, 2.0, 3.0, 2.0])  # rows 1, 2, 3, 2 of the batch of 8
TWO_BY_TWO = parse_topology({
    "name": "two2", "inter_gbps": 10,
    "machines": [{"name": "a", "gpu": "V100-32GB", "count": 2, "intra_gbps": 100},
                 {"name": "b", "gpu": "GTX1080Ti", "count": 2, "intra_gbps": 64}],
})


def one_option(option: str):
    def build(graph, topology):
        return Strategy.uniform(len(graph.ops), topology.num_machines, topology.num_devices, option,
                                batch_shares=UNEVEN, name=option)
    return build


def mixed(graph, topology):
    """METIS groups taking every option in turn, on both machines, machine a, or machine b."""
    groups = make_groups(graph, None, 8)
    masks = [[1, 1], [1, 0], [0, 1]]
    options = [OPTIONS[g % 4] for g in range(groups.num_groups)]
    chosen = [masks[(g // 4 + g) % 3] for g in range(groups.num_groups)]
    return Strategy(groups.assignment, np.array(chosen, dtype=bool), options, UNEVEN, name="mixed")


def fused(graph, topology):
    """AllReduce with Horovod's 64 MiB gradient buckets (one collective per bucket and replica)."""
    return Strategy.uniform(len(graph.ops), topology.num_machines, topology.num_devices, "allreduce",
                            batch_shares=UNEVEN, fusion_bytes=64 * 2**20, name="fused")


SCENARIOS = {option: one_option(option) for option in OPTIONS} | {"mixed": mixed, "fused": fused}


def _emit_run(tmp_path, model: str, strategy, steps: int = 3, topology=TWO_BY_TWO):
    emission = emit(resolve_model(MODELS[model], BATCH), topology, strategy, "cpu")
    out = write_emission(emission, tmp_path / "emitted")
    lines: list[str] = []
    result = run_emitted(out, steps=steps, check=True, timeout=240, echo=lines.append)
    return emission, result, lines


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("model", list(MODELS))
def test_emitted_step_matches_single_device(tmp_path, model, scenario):
    emission, result, lines = _emit_run(tmp_path, model, SCENARIOS[scenario])
    assert result.ok, "\n".join(lines)
    assert len(result.steps) == 3
    for step in result.steps:
        assert step["passed"] and step["max_relative_difference"] <= 1e-4
        assert abs(step["loss"] - step["reference_loss"]) <= 1e-4 * abs(step["reference_loss"])
        # Every variable was compared on every copy (less those whose gradient is rounding noise).
        noise = len(step.get("noise_gradient_variables", []))
        assert step["compared"]["variables"] == len(emission.reference.variables) - noise
        assert step["compared"]["copies"] >= step["compared"]["variables"]
    assert any("compared the loss and" in line for line in lines)
    if scenario == "mixed":
        kinds = {p.kind for p in emission.placed.placements}
        assert kinds == {"split", "full", "single"}
    if scenario in ("allreduce", "ps"):  # uneven shares became uneven sub-batches
        split = [p for p in emission.placed.placements if p.kind == "split"]
        assert split and split[0].batches == (1, 2, 3, 2)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_single_device_baseline_runs(tmp_path):
    emission, result, lines = _emit_run(tmp_path, "mlp", "single", steps=2)
    assert result.ok, "\n".join(lines)
    assert len({n.device for n in emission.emitted.graph_def.node}) == 1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_collective_missing_a_peer_fails_with_its_name(tmp_path):
    emission = emit(resolve_model(MODELS["mlp"], BATCH), TWO_BY_TWO, one_option("allreduce"), "cpu")
    nodes = {n.name: n for n in emission.emitted.graph_def.node}
    import tensorflow as tf

    for node in list(nodes.values()):
        if node.op == "CollectiveReduceV2":  # claim one more member than there is: every member waits
            size = nodes[node.input[1]]
            size.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.array(5, dtype=np.int32)))
    out = write_emission(emission, tmp_path / "emitted")
    result = run_emitted(out, steps=1, timeout=8)  # the pytest timeout catches a run that would not end
    assert not result.ok
    assert "step 0 failed" in result.error
    assert "waiting: collective tag/allreduce_" in result.error
    assert "/job:worker/task:" in result.error and "group 1 of 4 devices" in result.error


@pytest.mark.timeout(120)  # the child sleeps an hour: only the deadline can end this test in time
def test_a_hung_worker_is_stopped_at_the_deadline():
    meta = {"collectives": [{"node": "tag/allreduce_1/7", "device": "/job:worker/task:1/device:CPU:0",
                             "group": ["/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0"]}]}
    result = _supervise([sys.executable, "-c", "import time; time.sleep(3600)"], meta, time.monotonic() + 1.5, 1.5,
                        lambda line: None)
    assert not result.ok
    assert "did not finish within the 1.5 s timeout" in result.error
    assert "tag/allreduce_1/7 on /job:worker/task:1/device:CPU:0" in result.error


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_task_per_process_with_a_cluster_file(tmp_path):
    emission = emit(resolve_model(MODELS["mlp"], BATCH), TWO_BY_TWO, one_option("allreduce"), "cpu")
    out = write_emission(emission, tmp_path / "emitted")
    cluster = json.loads((out / "cluster.json").read_text())
    cluster["cluster"]["worker"] = [f"127.0.0.1:{_free_port()}" for _ in range(2)]
    cluster_file = tmp_path / "cluster.json"
    cluster_file.write_text(json.dumps(cluster))
    task1 = subprocess.Popen([sys.executable, "-m", "tag_core.cli", "run", str(out), "--cluster", str(cluster_file),
                              "--task-index", "1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             start_new_session=True)
    worker = None
    try:
        line = task1.stdout.readline()
        assert "serving" in line
        worker = int(line.split("(process ")[1].split(";")[0])
        result = run_emitted(out, steps=2, check=True, timeout=120, cluster=cluster_file, task_index=0)
        assert result.ok, "\n".join(result.lines + [result.error or ""])
        assert all(step["passed"] for step in result.steps)
    finally:
        os.killpg(task1.pid, signal.SIGKILL)
        task1.wait()
    # The serving worker (its own process group, servers inside) goes with the command that started it.
    deadline = time.monotonic() + 20
    while worker is not None and _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert worker is not None and not _alive(worker)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_run_cli_bad_folder_exits_2(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nothing")]) == 2
    assert "tag emit" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_cli_unreadable_folder_files_and_cluster_files_exit_2(tmp_path, capsys):
    import shutil

    emission = emit(resolve_model(MODELS["mlp"], BATCH), TWO_BY_TWO, "duplicate", "cpu")
    good = write_emission(emission, tmp_path / "emitted")
    assert (good / "initial_values.npz").is_file()
    for name, damage, problem in [("graph.pb", b"\x08\xff\xff", "is not a GraphDef"),
                                  ("initial_values.npz", b"", "cannot be read")]:
        broken = tmp_path / f"broken-{name}"
        shutil.copytree(good, broken)
        (broken / name).write_bytes(damage)
        capsys.readouterr()
        assert main(["run", str(broken), "--steps", "1"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("tag: error: DIR: ") and problem in err and "\n" not in err
    for content, problem in [("[1, 2]", "not a cluster file"),
                             ('{"cluster": {"worker": ["127.0.0.1:2999"]}}', "lists 1 workers; this graph has 2")]:
        (tmp_path / "cluster.json").write_text(content)
        assert main(["run", str(good), "--cluster", str(tmp_path / "cluster.json")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("tag: error: --cluster: ") and problem in err and "\n" not in err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_cli_json(tmp_path, capsys):
    emission = emit(resolve_model(MODELS["mlp"], BATCH), TWO_BY_TWO, "duplicate", "cpu")
    out = write_emission(emission, tmp_path / "emitted")
    assert main(["run", str(out), "--steps", "2", "--check", "--json", "--timeout", "120"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and len(report["steps"]) == 2 and report["max_relative_difference"] <= 1e-4


USER_MODELS = '''
import keras

def dropout_mlp():  # random masks: every replica must draw the single-device step's
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dropout(0.5), keras.layers.Dense(4, activation="softmax")])

def lstm():  # a while loop over the sequence, with its function library and variable handles
    return keras.Sequential([keras.Input((5, 3)), keras.layers.LSTM(8), keras.layers.Dense(4, activation="softmax")])

def bn_cnn():
    return keras.Sequential([
        keras.Input((6, 6, 3)),
        keras.layers.Conv2D(4, 3, name="conv"),
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.ReLU(),
        keras.layers.Flatten(),
        keras.layers.Dense(5, activation="softmax", name="head"),
    ])

def bn_dropout_cnn():  # batch statistics per replica and random masks: the reference runs per replica
    return keras.Sequential([
        keras.Input((6, 6, 3)),
        keras.layers.Conv2D(4, 3, use_bias=False, name="conv"),
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(5, activation="softmax", name="head"),
    ])
'''


@pytest.fixture
def user_models(tmp_path):
    path = tmp_path / "user_models.py"
    path.write_text(USER_MODELS)
    return path


@pytest.fixture
def bn_model(user_models):
    return f"{user_models}:bn_cnn"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("builder, option", [("dropout_mlp", "allreduce"), ("lstm", "allreduce"),
                                             ("lstm", "ps"),  # the loop's kernels on one PS, not round-robin
                                             ("lstm", "mixed")])  # the loops and their tensors in one group
def test_dropout_and_loops_match_the_single_device_step(tmp_path, user_models, builder, option):
    strategy = mixed if option == "mixed" else one_option(option)
    emission = emit(resolve_model(f"{user_models}:{builder}", BATCH), TWO_BY_TWO, strategy, "cpu")
    assert not emission.emitted.stat_ops  # neither computes batch statistics
    out = write_emission(emission, tmp_path / "emitted")
    lines: list[str] = []
    result = run_emitted(out, steps=2, check=True, timeout=200, echo=lines.append)
    assert result.ok, "\n".join(lines)
    assert result.reference == "single-device step" and all(step["passed"] for step in result.steps)
    # Compared, not waved through as noise: the sub-batch sums behind the noise test share the masks too.
    variables = len(json.loads((out / "plan.json").read_text())["emission"]["variables"])
    assert all(not step["noise_gradient_variables"] and step["compared"]["variables"] == variables
               for step in result.steps)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dropout_with_batch_norm_replicas_matches_the_per_sub_batch_reference(tmp_path, user_models):
    emission = emit(resolve_model(f"{user_models}:bn_dropout_cnn", BATCH), TWO_BY_TWO, one_option("allreduce"), "cpu")
    assert emission.emitted.stat_ops
    out = write_emission(emission, tmp_path / "emitted")
    lines: list[str] = []
    result = run_emitted(out, steps=2, check=True, timeout=200, echo=lines.append)
    assert result.ok, "\n".join(lines)
    assert "each replica's rows" in result.reference
    assert all(step["passed"] and not step["noise_gradient_variables"] for step in result.steps)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_batch_norm_replicas_match_the_per_sub_batch_reference(tmp_path, bn_model):
    emission = emit(resolve_model(bn_model, BATCH), TWO_BY_TWO, one_option("allreduce"), "cpu")
    assert emission.emitted.stat_ops and emission.emitted.stat_rows == (1, 2, 3, 2)
    assert len(emission.emitted.stat_writes) == 2  # moving mean and variance
    out = write_emission(emission, tmp_path / "emitted")
    plan = json.loads((out / "plan.json").read_text())
    assert set(plan["emission"]["batch_statistics"]["references"]) == {"1", "2", "3"}
    lines: list[str] = []
    result = run_emitted(out, steps=3, check=True, timeout=200, echo=lines.append)
    assert result.ok, "\n".join(lines)
    assert "each replica's rows [1, 2, 3, 2]" in result.reference
    assert all(step["passed"] for step in result.steps)
    # The conv bias before batch norm has a rounding-noise gradient: named, not compared.
    assert any("not compared" in line and "sequential/conv/bias" in line for line in lines)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_batch_norm_split_across_placements_skips_the_check_plainly(tmp_path, bn_model):
    def cut_inside_bn(graph, topology):
        groups = np.array([1 if "bn_1/batchnorm" in op.name else 0 for op in graph.ops])
        return Strategy(groups, np.array([[1, 1], [1, 0]], dtype=bool), ["allreduce", "allreduce"], UNEVEN)

    emission = emit(resolve_model(bn_model, BATCH), TWO_BY_TWO, cut_inside_bn, "cpu")
    assert "more than one placement" in emission.emitted.stat_rows
    out = write_emission(emission, tmp_path / "emitted")
    lines: list[str] = []
    result = run_emitted(out, steps=2, check=True, timeout=200, echo=lines.append)
    assert result.ok and result.check_skipped
    assert any(line.startswith("check skipped:") for line in lines)
    assert all("reference_loss" not in step for step in result.steps)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_distributed_graph_asset_emits_the_latest_plan_and_checks_it(tmp_path, monkeypatch):
    """A plan from the planner, stored; the asset writes its graph under $TAG_HOME/graphs and runs the check."""
    from dagster import MultiPartitionKey, instance_for_test, materialize

    from assets.emission import CHECK, distributed_graph, graph_folder
    from tag_core import store
    from tag_core.capture import capture
    from tag_core.plan import plan
    from tag_core.search import Budget
    from tag_pipelines.partitions import model_partitions, topology_partitions
    from tag_pipelines.resources import build_resources

    monkeypatch.setenv("TAG_HOME", str(tmp_path / "tag_home"))
    model = MODELS["mlp"]
    spec = resolve_model(model)
    planned = plan(capture(spec).graph, TWO_BY_TWO, None, budget=Budget(iterations=4), num_groups=4).to_dict()
    with store.connect() as conn:
        store.save_topology_snapshot(conn, "two2", TWO_BY_TWO.content_hash(), TWO_BY_TWO.to_dict(), None)
        store.save_plan(conn, "plan-1", planned, source="test", topology_key="two2")
    key = MultiPartitionKey({"model": model, "topology": "two2"})
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(model_partitions.name, [model])
        instance.add_dynamic_partitions(topology_partitions.name, ["two2"])
        result = materialize([distributed_graph], partition_key=key, instance=instance, resources=build_resources(),
                             run_config={"ops": {"distributed_graph": {"config": {"device_kind": "cpu"}}}})
    assert result.success
    folder = graph_folder(spec.name, "two2")
    assert (folder / "graph.pb").is_file() and folder.parent.parent == (tmp_path / "tag_home" / "graphs").resolve()
    meta = result.asset_materializations_for_node("distributed_graph")[0].metadata
    assert meta["plan_id"].value == "plan-1"
    assert meta["emitted_ops"].value > meta["single_device_ops"].value
    lineage = meta["lineage"].value
    assert lineage["graph_hash"] == planned["lineage"]["graph_hash"]
    assert lineage["topology_hash"] == TWO_BY_TWO.content_hash()
    checks = result.get_asset_check_evaluations()
    assert [c.check_name for c in checks] == [CHECK] and checks[0].passed
    assert checks[0].metadata["ran"].value is True
    assert checks[0].metadata["max_relative_difference"].value <= 1e-4
    assert checks[0].metadata["graph_rewrites"].value is False  # the check's session ran without grappler


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_gpu_graph_runs_here_on_cpu_devices(tmp_path):
    emission = emit(resolve_model(MODELS["mlp"], BATCH), TWO_BY_TWO, "ps", "gpu")
    out = write_emission(emission, tmp_path / "emitted")
    lines: list[str] = []
    result = run_emitted(out, steps=2, check=True, timeout=120, echo=lines.append)
    assert result.ok, "\n".join(lines)
    assert "GPU devices as CPU" in lines[0]
