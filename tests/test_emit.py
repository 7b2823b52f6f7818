"""The emitter: placements, the distributed GraphDef it builds, its folder, and bad input (exit 2)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from google.protobuf import text_format

from tag_core.capture import resolve_model
from tag_core.cli import main
from tag_core.cluster import load_topology
from tag_core.emit import emit, write_emission
from tag_core.emit.place import SINGLE, SPLIT, Placement
from tag_core.errors import TagInputError
from tag_core.simulate import Strategy

MLP = "mlp[features=12,hidden=16,layers=1]"
DEVICE = re.compile(r"^/job:worker/task:(\d+)/device:(CPU|GPU):(\d+)$")


@pytest.fixture(scope="module")
def two_by_two(tmp_path_factory):
    path = tmp_path_factory.mktemp("topo") / "two2.json"
    path.write_text(json.dumps({
        "name": "two2", "inter_gbps": 10,
        "machines": [{"name": "a", "gpu": "V100-32GB", "count": 2, "intra_gbps": 100},
                     {"name": "b", "gpu": "GTX1080Ti", "count": 2, "intra_gbps": 64}],
    }))
    return path


@pytest.fixture(scope="module")
def mlp_allreduce(two_by_two):
    spec = resolve_model(MLP, 8)
    shares = np.array([1.0, 2.0, 3.0, 2.0])
    strategy = Strategy.uniform(len(_graph(spec).ops), 2, 4, "allreduce", batch_shares=shares, name="uneven")
    return emit(spec, load_topology(two_by_two), strategy, "cpu")


def _graph(spec):
    from tag_core.capture import capture

    return capture(spec).graph


def test_placement_rows_and_weights():
    p = Placement(SPLIT, (0, 1, 2), (2, 3, 3))
    assert [p.rows(k) for k in range(3)] == [(0, 2), (2, 5), (5, 8)]
    assert [p.weight(k) for k in range(3)] == [0.25, 0.375, 0.375]
    single = Placement(SINGLE, (3,), (8,))
    assert single.rows(0) == (0, 8) and single.weight(0) == 1.0


def test_allreduce_graph_has_weighted_replicas_and_collectives(mlp_allreduce):
    e = mlp_allreduce
    nodes = {n.name: n for n in e.emitted.graph_def.node}
    # Every node is placed on a device of the topology.
    for node in nodes.values():
        match = DEVICE.match(node.device)
        assert match, node.name
        task, kind, index = int(match[1]), match[2], int(match[3])
        assert kind == "CPU" and task in (0, 1) and index in (0, 1)
    # One CollectiveReduceV2 per trainable variable and replica, all in one group of 4.
    trainable = [v for v in e.reference.variables if v.trainable]
    collectives = [n for n in nodes.values() if n.op == "CollectiveReduceV2"]
    assert len(collectives) == 4 * len(trainable) == len(e.emitted.collectives)
    assert {c.group_key for c in e.emitted.collectives} == {1}
    assert all(len(c.group) == 4 for c in e.emitted.collectives)
    # The gradient seed of replica k is its batch share, so the summed gradients are the full-batch mean.
    assert e.emitted.seed == "ones"
    import tensorflow as tf

    seeds = sorted(float(tf.make_ndarray(n.attr["value"].tensor)) for name, n in nodes.items()
                   if name.endswith("/ones") and name.startswith("tag/p"))
    assert seeds == pytest.approx([1 / 8, 2 / 8, 2 / 8, 3 / 8])
    # Inputs keep their names and are fed once, whole batch.
    assert nodes["inputs"].op == "Placeholder"
    assert nodes["inputs"].attr["shape"].shape.dim[0].size == 8
    # Every variable has a copy on each replica device, all initialised from one placeholder.
    for copies in e.emitted.variable_copies.values():
        assert len({device for _, device, _ in copies}) == 4


def test_emitted_graph_imports_and_is_bigger(mlp_allreduce):
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(mlp_allreduce.emitted.graph_def, name="")
    summary = mlp_allreduce.summary()
    assert summary["emitted_ops"] == len(graph.get_operations()) > 3 * summary["single_device_ops"]
    assert graph.get_tensor_by_name("tag/loss:0").dtype == tf.float32


@pytest.mark.parametrize("breakage, message", [
    (lambda node: node.input.append("no_such_op:0"), "no_such_op"),
    (lambda node: node.attr["T"].__setattr__("type", 999), "DataType"),
])
def test_a_graph_that_does_not_import_is_an_emitter_bug(mlp_allreduce, breakage, message):
    from tag_core.emit.emitter import check_imports

    graph_def = type(mlp_allreduce.emitted.graph_def)()
    graph_def.CopyFrom(mlp_allreduce.emitted.graph_def)
    check_imports(graph_def)
    breakage(next(n for n in graph_def.node if "T" in n.attr and n.input))
    with pytest.raises(RuntimeError, match=f"does not import into TensorFlow.*{message}"):
        check_imports(graph_def)


def test_write_emission_folder(mlp_allreduce, tmp_path):
    out = write_emission(mlp_allreduce, tmp_path / "out")
    names = {p.name for p in out.iterdir()}
    assert {"graph.pb", "graph.pbtxt", "cluster.json", "plan.json", "README.txt", "reference",
            "initial_values.npz"} <= names
    cluster = json.loads((out / "cluster.json").read_text())
    assert cluster["cluster"]["worker"] == ["127.0.0.1:2222", "127.0.0.1:2223"]
    assert cluster["tasks"][1]["devices"] == ["/job:worker/task:1/device:CPU:0", "/job:worker/task:1/device:CPU:1"]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["lineage"]["graph_hash"] == mlp_allreduce.graph.content_hash()
    assert plan["lineage"]["topology_hash"] == mlp_allreduce.topology.content_hash()
    assert Strategy.from_dict(plan["strategy"]).options == ["allreduce"]
    assert plan["emission"]["tasks"] == [2, 2]
    assert "tag run" in (out / "README.txt").read_text() and "tag train" in (out / "README.txt").read_text()
    readable = text_format.Parse((out / "graph.pbtxt").read_text(), type(mlp_allreduce.emitted.graph_def)())
    assert readable == mlp_allreduce.emitted.graph_def
    # Existing folder: refused without force, replaced with it; no temporary folders left behind.
    with pytest.raises(TagInputError, match="exists"):
        write_emission(mlp_allreduce, out)
    (out / "stale.txt").write_text("old")
    write_emission(mlp_allreduce, out, force=True)
    assert not (out / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_failed_write_leaves_nothing(mlp_allreduce, tmp_path, monkeypatch):
    import tag_core.emit.folder as emit_module

    def broken(_):
        raise RuntimeError("disk full")

    monkeypatch.setattr(emit_module, "readme", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        write_emission(mlp_allreduce, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_gpu_device_strings(two_by_two):
    spec = resolve_model(MLP, 4)
    e = emit(spec, load_topology(two_by_two), "ps", "gpu")
    devices = {n.device for n in e.emitted.graph_def.node}
    assert devices <= {f"/job:worker/task:{t}/device:GPU:{i}" for t in (0, 1) for i in (0, 1)}
    assert len(devices) == 4


def test_ps_keeps_one_copy_of_each_model_variable(two_by_two):
    e = emit(resolve_model(MLP, 8), load_topology(two_by_two), "ps", "cpu")
    model_vars = [v.name for v in e.reference.variables if v.owner == "model"]
    homes = {name: e.emitted.variable_copies[name] for name in model_vars}
    assert all(len(copies) == 1 for copies in homes.values())
    assert len({copies[0][1] for copies in homes.values()}) > 1  # spread over the parameter servers
    assert not e.emitted.collectives


def test_duplicate_and_model_parallel_have_no_collectives(two_by_two):
    topology = load_topology(two_by_two)
    dup = emit(resolve_model(MLP, 8), topology, "duplicate", "cpu")
    assert not dup.emitted.collectives and {p.kind for p in dup.placed.placements} == {"full", "single"}
    mp = emit(resolve_model(MLP, 8), topology, "model_parallel", "cpu")
    assert not mp.emitted.collectives and {p.kind for p in mp.placed.placements} == {"single"}
    used = {n.device for n in mp.emitted.graph_def.node}
    assert len(used) > 1


# ---- bad input: clear errors, exit 2, no output folder -------------------------------------


def _emit_args(tmp_path, *extra):
    return ["emit", MLP, "--out", str(tmp_path / "out"), "--device-kind", "cpu", *extra]


def _plan_file(tmp_path, two_by_two, **changes):
    spec = resolve_model(MLP)
    graph = _graph(spec)
    topology = load_topology(two_by_two)
    strategy = Strategy.uniform(len(graph.ops), 2, 4, "allreduce")
    plan = {"model": MLP, "topology": topology.name, "batch_size": spec.batch_size, "strategy": strategy.to_dict(),
            "lineage": {"graph_hash": graph.content_hash(), "topology_hash": topology.content_hash()}}
    for key, value in changes.items():
        if key in plan["lineage"]:
            plan["lineage"][key] = value
        else:
            plan[key] = value
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


@pytest.mark.parametrize("change, message", [
    ({"graph_hash": "0123456789abcdef"}, "another graph"),
    ({"topology_hash": "fedcba9876543210"}, "another topology"),
    ({"model": "small_cnn"}, "was made for model"),
])
def test_plan_for_something_else_is_refused(tag_home, tmp_path, two_by_two, capsys, change, message):
    plan = _plan_file(tmp_path, two_by_two, **change)
    code = main(_emit_args(tmp_path, "--plan", str(plan), "--topology", str(two_by_two)))
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _travelling_plan(tmp_path, two_by_two, edit=None):
    """A plan file as `tag plan` writes it: it carries its topology snapshot and hash."""
    path = _plan_file(tmp_path, two_by_two)
    plan = json.loads(path.read_text())
    topology = load_topology(two_by_two)
    plan.update(topology_snapshot={"hash": topology.content_hash(), "snapshot": topology.to_dict()}, oom=False,
                tag={"iteration_time_s": 0.01}, baselines={"dp_nccl": {"iteration_time_s": 0.01}})
    if edit:
        edit(plan)
    path.write_text(json.dumps(plan))
    return path


def test_a_plan_that_carries_its_snapshot_emits_with_nothing_else(tmp_path, two_by_two, monkeypatch, capsys):
    plan = _travelling_plan(tmp_path, two_by_two)
    monkeypatch.setenv("TAG_HOME", str(tmp_path / "elsewhere" / "fresh_home"))  # another machine's TAG_HOME
    assert main(_emit_args(tmp_path, "--plan", str(plan))) == 0, capsys.readouterr().err
    cluster = json.loads((tmp_path / "out" / "cluster.json").read_text())
    assert len(cluster["cluster"]["worker"]) == 2  # one task per machine of the carried snapshot


@pytest.mark.parametrize("edit, field", [
    (lambda p: p["topology_snapshot"]["snapshot"]["machines"][1].update(count=4), "topology_snapshot.snapshot"),
    (lambda p: p["lineage"].update(graph_hash="0123456789abcdef"), "another graph"),
], ids=["snapshot edited", "graph hash wrong"])
def test_a_tampered_travelling_plan_is_refused(tmp_path, two_by_two, capsys, edit, field):
    plan = _travelling_plan(tmp_path, two_by_two, edit)
    assert main(_emit_args(tmp_path, "--plan", str(plan))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tag: error: --plan") and field in err[0], err
    assert not (tmp_path / "out").exists()


def test_plan_with_missing_groups_is_refused(tag_home, tmp_path, two_by_two, capsys):
    plan_path = _plan_file(tmp_path, two_by_two)
    plan = json.loads(plan_path.read_text())
    n = plan["strategy"]["num_ops"]
    plan["strategy"]["op_groups"] = [0] * (n - 1) + [3]  # group 3 does not exist
    plan_path.write_text(json.dumps(plan))
    code = main(_emit_args(tmp_path, "--plan", str(plan_path), "--topology", str(two_by_two)))
    assert code == 2
    assert "group" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_plan_for_fewer_ops_is_refused(tag_home, tmp_path, two_by_two, capsys):
    plan_path = _plan_file(tmp_path, two_by_two)
    plan = json.loads(plan_path.read_text())
    plan["strategy"]["num_ops"] -= 5
    plan["lineage"] = {}
    plan_path.write_text(json.dumps(plan))
    assert main(_emit_args(tmp_path, "--plan", str(plan_path), "--topology", str(two_by_two))) == 2
    assert "op_groups" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_existing_out_needs_force(tag_home, tmp_path, two_by_two, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep me")
    code = main(_emit_args(tmp_path, "--topology", str(two_by_two), "--strategy", "allreduce"))
    assert code == 2
    assert "--force" in capsys.readouterr().err
    assert (tmp_path / "out" / "mine.txt").read_text() == "keep me"
    assert main(_emit_args(tmp_path, "--topology", str(two_by_two), "--strategy", "allreduce", "--force")) == 0
    assert (tmp_path / "out" / "graph.pb").exists() and not (tmp_path / "out" / "mine.txt").exists()


@pytest.mark.parametrize("extra, message", [
    (["--strategy", "allreduce"], "--topology"),
    (["--strategy", "sideways", "--topology", "TOPO"], "unknown baseline"),
    (["--plan", "missing.json", "--topology", "TOPO"], "does not exist"),
])
def test_bad_arguments_exit_2(tag_home, tmp_path, two_by_two, capsys, extra, message):
    extra = [str(two_by_two) if a == "TOPO" else a for a in extra]
    assert main(_emit_args(tmp_path, *extra)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_rows_move_away_from_batch_sizes_that_trace_differently():
    from tag_core.emit.emitter import _traceable_rows

    assert _traceable_rows([1, 2, 3, 2], lambda b: b != 1) == [2, 2, 2, 2]
    assert _traceable_rows([3, 5], lambda b: True) == [3, 5]
    with pytest.raises(TagInputError, match="no split of the batch"):
        _traceable_rows([1, 1], lambda b: b != 1)


def test_fusion_buckets_gradients(two_by_two):
    spec = resolve_model(MLP, 8)
    topology = load_topology(two_by_two)

    def allreduce(fusion_bytes):
        return lambda graph, t: Strategy.uniform(len(graph.ops), 2, 4, "allreduce", fusion_bytes=fusion_bytes)

    one_bucket = emit(spec, topology, allreduce(64 * 2**20), "cpu")
    trainable = [v for v in one_bucket.reference.variables if v.trainable]
    assert len(one_bucket.emitted.collectives) == 4  # every gradient of a replica in one collective
    assert one_bucket.emitted.collectives[0].tensor.startswith(f"{len(trainable)} gradients from ")
    ops = {n.op for n in one_bucket.emitted.graph_def.node}
    assert {"SplitV", "Reshape", "ConcatV2"} <= ops
    tiny = emit(spec, topology, allreduce(1), "cpu")  # every gradient fills a bucket by itself
    assert len(tiny.emitted.collectives) == 4 * len(trainable)


@pytest.mark.slow
def test_a_second_emit_of_a_model_reuses_its_traces_and_builds_the_same_graph(two_by_two):
    from tag_core.capture import capture
    from tag_core.capture.trace import builds

    topology = load_topology(two_by_two)
    shares = np.array([1.0, 2.0, 3.0, 2.0])

    def emitted():
        spec = resolve_model(MLP, 8)
        strategy = Strategy.uniform(len(capture(spec).graph.ops), 2, 4, "allreduce", batch_shares=shares)
        start = builds()
        emission = emit(spec, topology, strategy, "cpu")
        return emission, builds() - start

    first, first_builds = emitted()  # capture() built the model last: the emitter builds its own
    again = emit(resolve_model(MLP, 8), topology, first.strategy, "cpu")
    fresh, fresh_builds = emitted()  # capture() in between: a fresh build, as if nothing were kept
    assert (first_builds, fresh_builds) == (1, 1)
    assert _bytes(again) == _bytes(first)
    assert _bytes(fresh, normal=True) == _bytes(first, normal=True)
    for other in (again, fresh):
        assert other.initial_values.keys() == first.initial_values.keys()
        assert all(np.array_equal(other.initial_values[k], first.initial_values[k]) for k in first.initial_values)
    # Copies: rewriting one emission's traces leaves the next one's alone.
    again.reference.graph_def.node[0].name = "rewritten"
    assert emit(resolve_model(MLP, 8), topology, first.strategy, "cpu").reference.graph_def.node[0].name != "rewritten"


def _bytes(emission, normal: bool = False) -> bytes:
    """The emitted GraphDef; `normal` drops `_gradient_op_type`, a process-wide counter TF bumps at every trace."""
    graph_def = emission.emitted.graph_def
    if normal:
        from tag_core.capture.graph import copy_graph_def

        graph_def = copy_graph_def(graph_def)
        for node in graph_def.node:
            node.attr.pop("_gradient_op_type", None)
    return graph_def.SerializeToString(deterministic=True)


def test_a_steps_end_crosses_each_task_once():
    from tag_core.emit.nodes import NodeSink, parse_input, task_of

    sink = NodeSink()
    devices = [f"/job:worker/task:{t}/device:CPU:{d}" for t in range(3) for d in range(2)]
    ops = [sink.add(f"op{i}", "NoOp", [], devices[i % len(devices)]).name for i in range(12)]
    ops.append(sink.add("lonely", "NoOp", [], "/job:worker/task:3/device:CPU:0").name)
    train = sink.gather("tag/train", ops + ops[:2], devices[0])

    def waits_for(node) -> set[str]:
        found = set()
        for text in node.input:
            name, index = parse_input(text)
            assert index == -1  # control inputs only
            inner = sink.by_name[name]
            found |= waits_for(inner) if inner.op == "NoOp" and name.startswith("tag/train/") else {name}
        return found

    assert waits_for(train) == set(ops)  # every op, once
    crossing = [parse_input(i)[0] for i in train.input
                if task_of(sink.by_name[parse_input(i)[0]].device) != task_of(train.device)]
    assert sorted(crossing) == ["lonely", "tag/train/task_1", "tag/train/task_2"]  # one edge per other task
    assert all(task_of(sink.by_name[n].device) == n[-1] for n in crossing if n.startswith("tag/train/"))


def test_a_plan_that_stays_on_one_device_emits_the_graph_of_single(tmp_path):
    """The planner's `single` (step 8) and the `single` baseline emit one GraphDef and one cluster: a fidelity
    run that times both measures one graph twice, so a gap between them is the measurement's."""
    from simgraphs import profiles

    from tag_core.emit import write_emission
    from tag_core.plan.planner import plan
    from tag_core.search import Budget
    from tag_core.search.baselines import baseline
    from tag_core.simulate.simulator import Simulator

    path = tmp_path / "slow.json"  # two CPU tasks over a link too slow for any sync to pay
    path.write_text(json.dumps({"name": "slow", "inter_gbps": 0.001, "machines": [
        {"name": "task0", "gpu": "cpu", "count": 1, "intra_gbps": 100},
        {"name": "task1", "gpu": "cpu", "count": 1, "intra_gbps": 100}]}))
    topology = load_topology(path)
    planned = {}

    def by_planner(graph, topo):
        planned["result"] = plan(graph, topo, profiles(graph, "cpu"), batch_size=8, budget=Budget(iterations=5),
                                 sfb=False)
        planned["result"].strategy.name = "tag"
        return planned["result"].strategy

    def by_baseline(graph, topo):
        return baseline("single", Simulator(graph, topo, profiles(graph, "cpu"), batch_size=8))

    tag = emit(resolve_model(MLP, 8), topology, by_planner, "cpu")
    single = emit(resolve_model(MLP, 8), topology, by_baseline, "cpu")
    assert planned["result"].one_device is not None  # the planner chose one device
    assert _bytes(tag, normal=True) == _bytes(single, normal=True)
    for emission, name in ((tag, "tag"), (single, "single")):
        write_emission(emission, tmp_path / name)
    assert (tmp_path / "tag" / "cluster.json").read_text() == (tmp_path / "single" / "cluster.json").read_text()
    assert (tmp_path / "tag" / "graph.pb").read_bytes() == (tmp_path / "single" / "graph.pb").read_bytes()
