"""Fusion plans: legality (no compute ops, no cycles, no mixed reductions) and XLA equivalence."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tag_core.capture import Edge, Op, OpGraph, capture, resolve_model
from tag_core.fusion import classify, mark_for_xla, plan_fusion
from tag_core.fusion.patterns import COLUMN, ROW, reduction_kinds

TRANSFORMER = "transformer[layers=1,d_model=32,heads=2,ff=64,vocab=50,seq_len=8]"


@pytest.fixture(scope="module")
def transformer():
    captured = capture(resolve_model(TRANSFORMER, batch_size=2))
    return captured.graph, captured.step


def _op(name, op_type, size=4096):
    return Op(name=name, type=op_type, output_bytes=size, flops=size)


def _graph(ops, pairs):
    edges = [Edge(src=a, dst=b, bytes=ops[a].output_bytes, batch=True, tensor=f"{ops[a].name}:0") for a, b in pairs]
    return OpGraph(model="toy", batch_size=1, ops=ops, edges=edges, variables=[])


def test_classification():
    assert classify("MatMul") == "compute" and classify("Conv2DBackpropFilter") == "compute"
    assert classify("AddV2") == "memory" and classify("Transpose") == "memory" and classify("Sum") == "memory"
    assert classify("AssignVariableOp") == "variable" and classify("ReadVariableOp") == "variable"
    assert classify("VarHandleOp") == "other"


def test_a_chain_of_elementwise_ops_becomes_one_pattern():
    ops = [_op("x", "Placeholder"), _op("a", "Mul"), _op("b", "AddV2"), _op("c", "Tanh"), _op("m", "MatMul")]
    plan = plan_fusion(_graph(ops, [(0, 1), (1, 2), (2, 3), (3, 4)]))
    assert plan.patterns == [["a", "b", "c"]]
    assert plan.kernels_before == 5 and plan.kernels_after == 3 and plan.saved_s > 0


def test_no_merge_through_an_outside_op():
    # a -> MatMul -> b and a -> b: fusing a with b would put the MatMul inside a cycle.
    ops = [_op("x", "Placeholder"), _op("a", "Mul"), _op("m", "MatMul"), _op("b", "AddV2")]
    plan = plan_fusion(_graph(ops, [(0, 1), (1, 2), (2, 3), (1, 3)]))
    assert not any({"a", "b"} <= set(p) for p in plan.patterns)


def test_remote_merge_of_siblings():
    # Two consumers of one tensor with no edge between them may share a kernel.
    ops = [_op("x", "MatMul"), _op("a", "Exp"), _op("b", "Log"), _op("ma", "MatMul"), _op("mb", "MatMul")]
    plan = plan_fusion(_graph(ops, [(0, 1), (0, 2), (1, 3), (2, 4)]))
    assert plan.patterns == [["a", "b"]]


@pytest.mark.slow
def test_variable_updates_join_the_arithmetic_that_feeds_them(transformer):
    graph, step = transformer
    types = {op.name: op.type for op in graph.ops}
    plan = plan_fusion(graph, step.graph_def)
    updates = [p for p in plan.patterns if any(types[n] in ("AssignAddVariableOp", "AssignSubVariableOp") for n in p)]
    assert updates and all(any(types[n] in ("Mul", "Sub", "RealDiv") for n in p) for p in updates)
    plain = plan_fusion(graph, step.graph_def, variables=False)
    assert not any(types[n] in ("AssignAddVariableOp", "ReadVariableOp") for p in plain.patterns for n in p)


@pytest.mark.slow
def test_transformer_plan_is_legal(transformer):
    graph, step = transformer
    plan = plan_fusion(graph, step.graph_def)
    assert plan.patterns and plan.kernels_after < plan.kernels_before
    index = graph.index
    kinds = reduction_kinds(graph, step.graph_def)
    assert (kinds == ROW).any()
    for pattern in plan.patterns:
        members = [index[name] for name in pattern]
        assert all(classify(graph.ops[i].type) in ("memory", "variable") for i in members)
        assert any(classify(graph.ops[i].type) == "memory" for i in members)
        assert not {ROW, COLUMN} <= set(kinds[members].tolist())
    # Contracting every pattern to one node must leave the graph acyclic.
    group = np.arange(len(graph.ops))
    for k, pattern in enumerate(plan.patterns):
        group[[index[n] for n in pattern]] = len(graph.ops) + k
    _, dense = np.unique(group, return_inverse=True)
    pairs = {(int(dense[e.src]), int(dense[e.dst])) for e in graph.edges if dense[e.src] != dense[e.dst]}
    contracted = OpGraph("c", 1, [_op(str(i), "X") for i in range(dense.max() + 1)],
                         [Edge(a, b, 0, False, "") for a, b in sorted(pairs)], [])
    contracted.topological_order()  # raises on a cycle
    assert json.loads(json.dumps(plan.to_json()))["ops_fused"] == plan.ops_fused


@pytest.mark.slow
def test_xla_marked_step_computes_the_same(transformer):
    import tensorflow as tf

    from tag_core.capture import synthetic_batch
    from tag_core.profile import initialise_randomly

    graph, step = transformer
    plan = plan_fusion(graph, step.graph_def)
    losses = {}
    for mode in ("plain", "fused"):
        graph_def = tf.compat.v1.GraphDef()
        graph_def.CopyFrom(step.graph_def)
        if mode == "fused":
            assert mark_for_xla(graph_def, plan, [step.loss_tensor, *step.train_ops])["nodes_marked"] >= plan.ops_fused
        g = tf.Graph()
        with g.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=g) as session:
            initialise_randomly(session, step)
            feed = dict(zip(step.input_tensors, synthetic_batch(resolve_model(TRANSFORMER), 2)))
            losses[mode] = [float(session.run([step.loss_tensor, step.train_ops], feed_dict=feed)[0]) for _ in range(3)]
    assert losses["plain"][0] > losses["plain"][-1]  # it trains
    np.testing.assert_allclose(losses["fused"], losses["plain"], rtol=1e-4)


@pytest.mark.slow
def test_fusion_plan_asset_stores_the_plan_and_measures(tag_home):
    from dagster import instance_for_test, materialize

    from assets.capture import training_graph
    from assets.fusion import fusion_plan
    from tag_core import store
    from tag_pipelines.partitions import model_partitions
    from tag_pipelines.resources import build_resources

    model = "mlp[features=16,hidden=16]"
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(model_partitions.name, [model])
        # Untuned, so the plan keeps its patterns whatever XLA does on this CPU today.
        config = {"ops": {"fusion_plan": {"config": {"steps": 2, "tune": False}}}}
        result = materialize([training_graph, fusion_plan], partition_key=model, instance=instance,
                             resources=build_resources(), run_config=config)
    assert result.success
    meta = result.asset_materializations_for_node("fusion_plan")[0].metadata
    assert meta["kernels_after"].value < meta["kernels_before"].value
    assert "| tag |" in meta["measured"].value and "| autocluster |" in meta["measured"].value
    with store.connect(read_only=True) as conn:
        stored = store.load_fusion_plan(conn, model, store.captured_model(conn, model)["graph_hash"])
    assert stored["ops_fused"] == meta["ops_fused"].value
    assert set(stored["measured"]["step_ms"]) == {"tf", "autocluster", "jit", "tag"}


@pytest.mark.slow
def test_planner_sees_fused_costs(transformer):
    from tag_core.cluster import parse_topology
    from tag_core.plan import plan
    from tag_core.search import Budget

    graph, step = transformer
    topology = parse_topology({"name": "pair", "machines": [{"name": "a", "gpu": "T4", "count": 2, "intra_gbps": 64}],
                               "inter_gbps": 10})
    fusion = plan_fusion(graph, step.graph_def)
    fused = plan(graph, topology, None, num_groups=6, budget=Budget(iterations=10), fusion=fusion).to_dict()
    plain = plan(graph, topology, None, num_groups=6, budget=Budget(iterations=10)).to_dict()
    assert fused["fusion"] == {"patterns": len(fusion.patterns), "ops_fused": fusion.ops_fused,
                               "kernels_before": fusion.kernels_before, "kernels_after": fusion.kernels_after}
    assert "fusion" not in plain
    assert fused["baselines"]["dp_nccl"]["iteration_time_s"] < plain["baselines"]["dp_nccl"]["iteration_time_s"]


TWO_BY_TWO = {"name": "two2", "inter_gbps": 10,
              "machines": [{"name": "a", "gpu": "V100-32GB", "count": 2, "intra_gbps": 100},
                           {"name": "b", "gpu": "GTX1080Ti", "count": 2, "intra_gbps": 64}]}


def _clusters(graph_def) -> dict[str, set[str]]:
    """_XlaScope -> devices of its nodes."""
    scopes: dict[str, set[str]] = {}
    for node in graph_def.node:
        if "_XlaScope" in node.attr:
            assert node.attr["_XlaCompile"].b
            scopes.setdefault(node.attr["_XlaScope"].s.decode(), set()).add(node.device)
    return scopes


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_emit_with_a_fusion_plan_file_passes_the_check(tmp_path, tag_home, capsys):
    """`tag fuse --json` > file; `tag emit --fusion file`; `tag run --check` holds within 1e-4."""
    from tensorflow.core.framework import graph_pb2

    from tag_core.cli import main

    model = "mlp[features=12,hidden=16]"
    assert main(["fuse", model, "--batch-size", "8", "--json"]) == 0
    fusion = json.loads(capsys.readouterr().out)
    assert fusion["patterns"]
    (tmp_path / "fusion.json").write_text(json.dumps(fusion))
    (tmp_path / "topology.json").write_text(json.dumps(TWO_BY_TWO))
    out = tmp_path / "emitted"
    assert main(["emit", model, "--topology", str(tmp_path / "topology.json"), "--strategy", "allreduce",
                 "--device-kind", "cpu", "--batch-size", "8", "--fusion", str(tmp_path / "fusion.json"),
                 "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["fusion"]["patterns"] == len(fusion["patterns"])
    assert summary["fusion"]["ops_fused"] == fusion["ops_fused"]
    graph_def = graph_pb2.GraphDef.FromString((out / "graph.pb").read_bytes())
    scopes = _clusters(graph_def)
    # Each copy of a pattern is its own cluster, on one device: four replicas, four copies of every pattern
    # (more where a pattern spans per-replica backward ops and the optimizer update all replicas run).
    assert len(scopes) == summary["fusion"]["clusters"] >= 4 * len(fusion["patterns"])
    assert all(len(devices) == 1 for devices in scopes.values())
    assert json.loads((out / "plan.json").read_text())["summary"]["fusion"] == summary["fusion"]
    assert main(["run", str(out), "--steps", "2", "--check", "--json", "--timeout", "240"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and len(report["steps"]) == 2 and report["max_relative_difference"] <= 1e-4


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy", ["duplicate", "ps"])
def test_emitted_cnn_with_fresh_fusion_plan_matches_single_device(tmp_path, strategy):
    """Variable updates inside clusters too: PS puts each variable and its writers on one device."""
    from tag_core.cluster import parse_topology
    from tag_core.emit import emit, write_emission
    from tag_core.runtime import run_emitted

    emission = emit(resolve_model("small_cnn[image_size=8]", 8), parse_topology(TWO_BY_TWO), strategy, "cpu",
                    fusion=lambda graph, step: plan_fusion(graph, step.graph_def))
    types = {op.name: op.type for op in emission.graph.ops}
    assert any(types[n] == "AssignAddVariableOp" for p in plan_fusion(emission.graph, emission.reference.graph_def
                                                                      ).patterns for n in p)
    assert emission.fusion["patterns"] > 0 and emission.fusion["nodes_marked"] >= emission.fusion["ops_fused"]
    out = write_emission(emission, tmp_path / "emitted")
    lines: list[str] = []
    result = run_emitted(out, steps=2, check=True, timeout=240, echo=lines.append)
    assert result.ok, "\n".join(lines)
    assert all(step["passed"] and step["max_relative_difference"] <= 1e-4 for step in result.steps)


def test_emit_rejects_a_fusion_plan_of_another_model(tmp_path, tag_home):
    from tag_core.cli import main

    (tmp_path / "fusion.json").write_text(json.dumps({"model": "other", "patterns": [], "kernels_before": 1,
                                                      "kernels_after": 1}))
    (tmp_path / "topology.json").write_text(json.dumps(TWO_BY_TWO))
    assert main(["emit", "mlp", "--topology", str(tmp_path / "topology.json"), "--strategy", "allreduce",
                 "--fusion", str(tmp_path / "fusion.json"), "--out", str(tmp_path / "out")]) == 2


@pytest.mark.slow
def test_tuning_keeps_winners_and_the_step_check_never_adds(tmp_path):
    """Per-pattern tuning (variables included) keeps a subset; the step check keeps a subset of that."""
    from tag_core.fusion import check_step, step_fetches, tune_plan
    from tag_core.fusion.step_check import STEP_MARGIN
    from tag_core.fusion.tune import step_values

    spec = resolve_model("mlp[features=12,hidden=16]", 8)
    captured = capture(spec)
    planned = plan_fusion(captured.graph, captured.step.graph_def)
    assert any("AssignAddVariableOp" in {captured.graph.ops[captured.graph.index[n]].type for n in p}
               for p in planned.patterns)
    tuned = tune_plan(planned, captured.step.graph_def, step_fetches(captured.step), runs=5,
                      values=lambda names: step_values(captured.step, spec, names))
    m = tuned.measured
    assert m["tuned_patterns_kept"] + m["tuned_patterns_dropped"] + m["tuned_patterns_untimed"] == len(planned.patterns)
    assert all(p in planned.patterns for p in tuned.patterns)
    assert len(m["pattern_saving_us"]) == len(tuned.patterns)
    assert m["tuned_patterns_untimed"] < len(planned.patterns)  # variables and integer inputs are timed
    assert 0 <= m["tuned_signatures_timed_longer"] <= m["tuned_signatures"]
    # Every MatMul was timed as a library call; the regions hold all but those XLA ran over 2x slower.
    matmuls = [op.name for op in captured.graph.ops if op.type == "MatMul"]
    assert m["library_calls_timed"] == len(matmuls) and tuned.regions
    in_regions = {n for region in tuned.regions for n in region}
    assert m["library_calls_outside"] == len(set(matmuls) - in_regions)
    checked = check_step(tuned, captured.step, spec, seconds=0.2)
    assert all(p in tuned.patterns for p in checked.patterns)
    assert checked.kernels_after == checked.kernels_before - checked.ops_fused + len(checked.patterns)
    check = checked.measured["step_check"]
    assert check["rounds"] >= 6 and check["kept_patterns"] == len(checked.patterns)
    assert check["kept_regions"] == len(checked.regions) and checked.regions in ([], tuned.regions)
    in_kept = {n for region in checked.regions for n in region}
    assert not any(in_kept.issuperset(p) for p in checked.patterns)  # a pattern inside a region marks nothing
    assert check["variants"][0]["regions"] == len(tuned.regions)  # the regions were a candidate, timed first
    assert all(v["rounds"] >= 6 for v in check["variants"] if "ratio" in v)
    beat = [v for v in check["variants"] if "ratio" in v and v["ratio"] <= 1 - STEP_MARGIN
            and v["ratio_interval"][1] < 1.0]
    assert bool(checked.patterns or checked.regions) == bool(beat)


def test_a_variant_is_kept_on_its_interval_and_the_first_of_those_alike_wins():
    """The step check's choice on paired ratios (no timing here: the rule itself)."""
    from tag_core.fusion.paired import median_interval
    from tag_core.fusion.step_check import _choose

    assert median_interval([0.9, 0.95, 1.0, 1.05, 1.1, 1.2]) == (0.9, 1.025, 1.2)  # 6 rounds: the extremes
    low, median, high = median_interval([0.9 + 0.01 * (k % 5) for k in range(40)])
    assert low <= median <= high < 1.0
    variants = ["all", "half", "quarter"]
    # A median past the margin whose interval reaches 1 is noise: nothing is kept.
    assert _choose(variants, [(0.90, 0.96, 1.01), (0.9, 1.0, 1.1), (0.9, 1.0, 1.1)], 0.02) is None
    # Two that beat the plain step and that the noise cannot tell apart: the first, not the lower median.
    assert _choose(variants, [(0.93, 0.95, 0.97), (0.92, 0.94, 0.96), (0.9, 1.0, 1.1)], 0.02) == "all"
    # One clearly faster than the other: that one.
    assert _choose(variants, [(0.95, 0.96, 0.97), (0.80, 0.82, 0.84), (0.9, 1.0, 1.1)], 0.02) == "half"


def test_patterns_inside_the_regions_leave_the_plan_and_a_saving_near_the_margin_is_timed_longer():
    """A region's program fuses the patterns within it: only those reaching outside stay. A pattern whose saving's
    interval holds the margin is undecided (more runs follow); one clear of it either way is not."""
    from tag_core.fusion.patterns import FusionPlan
    from tag_core.fusion.regions import outside_regions
    from tag_core.fusion.tune import PairedTiming

    plan = FusionPlan("m", [["a", "b"], ["c", "x"], ["d", "e"]], 10, 7, 0.0, "V100-32GB",
                      {"pattern_saving_us": [3.0, 2.0, 1.0]}, regions=[["a", "b", "c", "d", "e", "f"]])
    outside = outside_regions(plan)
    assert outside.patterns == [["c", "x"]] and outside.regions == plan.regions
    assert outside.measured["pattern_saving_us"] == [2.0] and outside.measured["patterns_inside_regions"] == 2
    assert outside.kernels_after == 10 - 2 + 1
    assert outside_regions(FusionPlan("m", [["a", "b"]], 4, 3, 0.0, "")).patterns == [["a", "b"]]  # no regions

    margin = PairedTiming(1e-3, 0.9e-3, 0.0, 0.0).margin_s  # 5% of the plain run
    assert margin == pytest.approx(5e-5)
    near = PairedTiming(1e-3, 0.9e-3, 6e-5, 4e-5, 8e-5)
    assert near.wins and near.undecided  # it wins on this median, but the interval holds the margin
    clear_win = PairedTiming(1e-3, 0.8e-3, 2e-4, 1.5e-4, 2.5e-4)
    clear_loss = PairedTiming(1e-3, 1.1e-3, -1e-4, -2e-4, 1e-5)
    assert clear_win.wins and not clear_win.undecided
    assert not clear_loss.wins and not clear_loss.undecided


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_a_tuned_plan_from_tag_fuse_is_stored_for_plan_and_emit(tag_home, capsys):
    from tag_core import store
    from tag_core.cli import main

    model = "mlp[features=12,hidden=16]"
    assert main(["fuse", model, "--batch-size", "8", "--json"]) == 0  # untuned: printed, not stored
    capsys.readouterr()
    with store.connect(read_only=True) as conn:
        assert store.load_fusion_plan(conn, model) is None
    assert main(["fuse", model, "--batch-size", "8", "--tune", "--no-regions", "--json"]) == 0
    tuned = json.loads(capsys.readouterr().out)
    with store.connect(read_only=True) as conn:
        stored = store.load_fusion_plan(conn, model)
    assert stored is not None and stored["patterns"] == tuned["patterns"] and stored["regions"] == []
    assert "library_calls_timed" not in tuned["measured"]  # --no-regions: no compute op was timed


@pytest.mark.slow
def test_paired_measurement_with_auto_clustering_confined_to_fusible_ops(tmp_path):
    from tag_core.capture import save_step
    from tag_core.fusion.measure import FUSIBLE_ONLY_FLAGS, PAIRED_FLAGS, measure_paired

    spec = resolve_model("mlp[features=16,hidden=16]", batch_size=4)
    captured = capture(spec)
    _, step_file = save_step(captured.step, tmp_path)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan_fusion(captured.graph, captured.step.graph_def).to_json()))
    runs = {flags: measure_paired(spec.name, 4, str(step_file), str(plan_file), rounds=2, warmup=1,
                                  modes=("tf", "autocluster"), flags=flags)
            for flags in (PAIRED_FLAGS, FUSIBLE_ONLY_FLAGS)}
    for result in runs.values():
        assert set(result["ratio_to_tf"]) == {"tf", "autocluster"} and result["ratio_to_tf"]["tf"] == 1.0
    whole, confined = (runs[f]["kernels"]["autocluster"] for f in (PAIRED_FLAGS, FUSIBLE_ONLY_FLAGS))
    # Confined, the MatMuls stay outside the clusters: more kernels than whole-graph auto-clustering.
    assert whole < confined < runs[PAIRED_FLAGS]["kernels"]["tf"]
    with pytest.raises(ValueError, match="include tf"):
        measure_paired(spec.name, 4, str(step_file), str(plan_file), modes=("autocluster",))
