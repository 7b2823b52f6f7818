"""Compiled regions: what joins one, how a plan carries them, that XLA keeps compute ops as library calls, and
that an emitted step with regions still computes what the single-device step does."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tag_core.errors import TagInputError
from tag_core.fusion import FusionPlan, compile_as_calls, compiled_regions, mark_for_xla, session_config
from tag_core.fusion.regions import REWRITES_OFF


def _toy_step():
    """x @ read(w) + 1, times a random mask, summed; after it, an update of v; arithmetic on constants aside."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[8, 4], shared_name="w", name="w")
        read = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32, name="read")
        product = tf.raw_ops.MatMul(a=x, b=read, name="product")
        shifted = tf.raw_ops.AddV2(x=product, y=tf.constant(1.0, name="one"), name="shifted")
        mask = tf.raw_ops.RandomUniform(shape=tf.constant([4, 4], name="mask_shape"), dtype=tf.float32, seed=1, seed2=2,
                                        name="mask")
        masked = tf.raw_ops.Mul(x=shifted, y=mask, name="masked")
        total = tf.raw_ops.Sum(input=masked, axis=tf.constant([0, 1], name="axes"), name="total")
        other = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[2], shared_name="v", name="v")
        read_other = tf.raw_ops.ReadVariableOp(resource=other, dtype=tf.float32, name="read_other")
        with tf.control_dependencies([total]):  # joined to the rest by this control edge only
            step = tf.raw_ops.Neg(x=read_other, name="step")
        tf.raw_ops.AssignAddVariableOp(resource=other, value=step, name="update")
        tf.raw_ops.AddV2(x=tf.constant(2.0, name="c1"), y=tf.constant(3.0, name="c2"), name="folded")
    return graph.as_graph_def()


TOY_FETCHES = ["total:0", "update"]


def test_a_region_joins_compute_ops_and_leaves_out_randomness_plumbing_and_constants():
    graph_def = _toy_step()
    (region,) = compiled_regions(graph_def, excluded=set(), roots=TOY_FETCHES)
    assert {"read", "product", "shifted", "masked", "total", "step", "update"} <= set(region)
    assert not {"x", "w", "v", "mask", "one", "folded"} & set(region)  # placeholder, handle, random, constants
    # What the step does not run stays out, whatever it is.
    assert compiled_regions(graph_def, excluded=set(), roots=["total:0"]) == [
        [n for n in region if n not in {"read_other", "step", "update"}]]
    # A compute op that XLA ran too slowly stays out; the rest splits where it was.
    pieces = compiled_regions(graph_def, excluded={"product"}, roots=TOY_FETCHES)
    assert all("product" not in piece for piece in pieces) and {"shifted", "masked", "total"} <= set(pieces[0])


def _run(graph_def, fetches, x):
    """`fetches` in two steps of `graph_def` from w = 0.5 and v = [1, 2], and v after them."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
        assigns = [tf.raw_ops.AssignVariableOp(resource=graph.get_tensor_by_name(f"{h}:0"), value=value)
                   for h, value in (("w", np.full([8, 4], 0.5, np.float32)), ("v", np.array([1.0, 2.0], np.float32)))]
        read_v = tf.raw_ops.ReadVariableOp(resource=graph.get_tensor_by_name("v:0"), dtype=tf.float32)
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(assigns)
        found = [session.run(fetches, {"x:0": x}) for _ in range(2)]
        return found, session.run(read_v)


def test_a_region_runs_as_one_must_compile_call_and_computes_what_the_plain_step_does():
    graph_def = _toy_step()
    plain = tf_copy(graph_def)
    plan = FusionPlan("toy", patterns=[["shifted", "masked"], ["folded", "c1"]], kernels_before=10, kernels_after=8,
                      saved_s=0.0, reference_gpu="V100-32GB",
                      regions=compiled_regions(graph_def, set(), TOY_FETCHES))
    marked = mark_for_xla(graph_def, plan, TOY_FETCHES)
    assert marked["calls"] == 1 and marked["splits"] == 0
    nodes = {n.name: n for n in graph_def.node}
    (call,) = [n for n in graph_def.node if n.op == "StatefulPartitionedCall"]
    assert call.attr["_XlaMustCompile"].b and call.attr["f"].func.name in {f.signature.name for f in graph_def.library.function}
    # The region's ops are gone, the names the caller fetches stay; the pattern inside the region went with it.
    assert not {"read", "product", "shifted", "masked", "step"} & set(nodes)
    assert nodes["total"].op == "Identity" and nodes["update"].op == "NoOp"
    assert nodes["folded"].attr["_XlaScope"].s == b"fusion_1" and "_XlaScope" not in nodes["x"].attr
    x = np.random.default_rng(0).standard_normal([4, 8]).astype(np.float32)
    (plain_steps, plain_v), (called_steps, called_v) = _run(plain, TOY_FETCHES, x), _run(graph_def, TOY_FETCHES, x)
    assert np.allclose([t for t, _ in plain_steps], [t for t, _ in called_steps], rtol=1e-5)
    assert np.allclose(plain_v, called_v) and not np.allclose(called_v, [1.0, 2.0])  # the update ran, twice


def tf_copy(graph_def):
    import tensorflow as tf

    copy = tf.compat.v1.GraphDef()
    copy.CopyFrom(graph_def)
    return copy


def test_a_region_that_an_outside_op_runs_through_is_split_so_the_graph_stays_acyclic():
    """a1 -> a2 -> b -> c1 -> c2, and a2 -> c1: with b outside, one call for all four would wait on itself."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [3], name="x")
        a2 = tf.raw_ops.Abs(x=tf.raw_ops.Neg(x=x, name="a1"), name="a2")
        b = tf.raw_ops.Square(x=a2, name="b")
        tf.raw_ops.Neg(x=tf.raw_ops.AddV2(x=a2, y=b, name="c1"), name="c2")
    graph_def = graph.as_graph_def()
    plain = tf_copy(graph_def)
    calls = compile_as_calls(graph_def, [["a1", "a2", "c1", "c2"]], ["c2:0"])
    assert calls.splits == 1 and sorted(calls.ops) == [2, 2]
    values = []
    for g in (plain, graph_def):
        with tf.Graph().as_default() as imported:
            tf.compat.v1.import_graph_def(g, name="")  # an import fails on a cycle
        with tf.compat.v1.Session(graph=imported) as session:
            values.append(session.run("c2:0", {"x:0": [1.0, -2.0, 3.0]}))
    assert np.array_equal(*values)


def test_only_ops_with_an_xla_kernel_may_join():
    from tensorflow.core.framework import node_def_pb2

    from tag_core.fusion.regions import has_xla_kernel, may_join

    assert has_xla_kernel("MatMul") and has_xla_kernel("AssignAddVariableOp") and has_xla_kernel("NoOp")
    assert not has_xla_kernel("StringFormat") and not has_xla_kernel("_MklMatMul")
    constant = node_def_pb2.NodeDef(name="c", op="Const")
    assert not may_join(constant)  # copied into each region that reads it instead
    constant.input.append("^other")
    assert may_join(constant)  # it orders work: it joins like any op


def test_a_plan_carries_its_regions_and_a_bad_one_is_named():
    plan = FusionPlan("toy", [["a", "b"]], 4, 3, 0.0, "V100-32GB", regions=[["a", "b", "m"]])
    assert FusionPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert FusionPlan.from_json({**plan.to_json(), "regions": []}).regions == []
    for bad, where in (({"regions": [[]]}, "regions[0]"), ({"regions": "a"}, "regions"),
                       ({"regions": [["a", 3]]}, "regions[0]")):
        with pytest.raises(TagInputError) as raised:
            FusionPlan.from_json({**plan.to_json(), **bad})
        assert raised.value.where == where


def test_only_a_plan_with_regions_turns_the_memory_optimizer_off():
    from tensorflow.core.protobuf import rewriter_config_pb2

    assert REWRITES_OFF == ("memory_optimization",)
    with_regions = FusionPlan("toy", [], 4, 4, 0.0, "V100-32GB", regions=[["a", "b"]])
    rewrites = session_config(with_regions).graph_options.rewrite_options
    assert rewrites.memory_optimization == rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
    for plan in (None, FusionPlan("toy", [["a", "b"]], 4, 3, 0.0, "V100-32GB")):
        rewrites = session_config(plan).graph_options.rewrite_options
        assert rewrites.memory_optimization == rewriter_config_pb2.RewriterConfig.DEFAULT_MEM_OPT


HLO_SCRIPT = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[2])
    import tensorflow as tf
    from tag_core.fusion import FusionPlan, classify
    from tag_core.fusion import mark_for_xla
    from tag_core.fusion import compiled_regions, session_config
    from tag_core.capture import capture
    from tag_core.capture import resolve_model
    from tag_core.profile import initialise_randomly
    from tag_core.capture import synthetic_batch

    spec = resolve_model("mlp[features=12,hidden=16]", 8)
    step = capture(spec).step
    fetches = [step.loss_tensor, *step.train_ops]
    plan = FusionPlan(spec.name, [], 0, 0, 0.0, "", regions=compiled_regions(step.graph_def, set(), fetches))
    graph_def = tf.compat.v1.GraphDef()
    graph_def.CopyFrom(step.graph_def)
    mark_for_xla(graph_def, plan, fetches)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph, config=session_config(plan)) as session:
        initialise_randomly(session, step)
        session.run([step.loss_tensor, step.train_ops], dict(zip(step.input_tensors, synthetic_batch(spec, 8))))
    types = {node.name: node.op for node in step.graph_def.node}
    written = {node.input[0] for region in plan.regions for node in step.graph_def.node
               if node.name in region and node.op.startswith("Assign")}
    print(len(written), sum(classify(types[name]) == "compute" for region in plan.regions for name in region))
""")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_xla_compiles_a_region_with_library_calls_and_variables_updated_in_place(tmp_path):
    """The optimised HLO of the step's region: every dot is an instruction of its own, never inside a fusion, and
    every variable the step writes (parameters, Adam's moments, its step counter) aliases its input buffer."""
    import os

    dump = tmp_path / "hlo"
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_as_text", TF_CPP_MIN_LOG_LEVEL="2")
    script = tmp_path / "region.py"
    script.write_text(HLO_SCRIPT)
    done = subprocess.run([sys.executable, str(script), "", str(Path(__file__).resolve().parent.parent)],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    modules = [p.read_text() for p in dump.glob("*after_optimizations.txt")]
    biggest = max(modules, key=len)
    computations = biggest.split("\n\n")
    fused = [c for c in computations if c.lstrip().startswith(("%fused", "fused"))]
    top = [c for c in computations if c.lstrip().startswith("ENTRY")]
    assert fused and top, "the region compiled to one module with fusions"
    written, compute_ops = map(int, done.stdout.split()[-2:])
    assert compute_ops >= 5  # two layers' MatMuls, forward and backward
    header = biggest.split("\n", 1)[0]
    assert written >= 13 and header.count("may-alias") == written  # 4 parameters x (value, 2 moments) + counter
    assert sum(c.count(" dot(") for c in top) == biggest.count(" dot(") == compute_ops
    assert all(" dot(" not in c for c in fused)


TWO_BY_TWO = {"name": "two2", "inter_gbps": 10,
              "machines": [{"name": "a", "gpu": "V100-32GB", "count": 2, "intra_gbps": 100},
                           {"name": "b", "gpu": "GTX1080Ti", "count": 2, "intra_gbps": 64}]}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy", ["allreduce", "ps"])
def test_an_emitted_step_with_regions_matches_the_single_device_step(tmp_path, strategy):
    from tag_core.capture import resolve_model
    from tag_core.cluster import parse_topology
    from tag_core.emit import emit, write_emission
    from tag_core.fusion import step_fetches
    from tag_core.runtime import run_emitted

    def with_regions(graph, step):
        return FusionPlan(graph.model, [], len(graph.ops), len(graph.ops), 0.0, "",
                          regions=compiled_regions(step.graph_def, set(), step_fetches(step)))

    emission = emit(resolve_model("mlp[features=12,hidden=16]", 8), parse_topology(TWO_BY_TWO), strategy, "cpu",
                    fusion=with_regions)
    assert emission.fusion["regions"] >= 1 and emission.fusion["calls"] >= 2  # a call per device at least
    out = write_emission(emission, tmp_path / "emitted")
    meta = json.loads((out / "plan.json").read_text())["emission"]
    assert meta["rewrites_off"] == list(REWRITES_OFF)
    assert "rewrite_options" in (out / "README.txt").read_text()
    lines: list[str] = []
    result = run_emitted(out, steps=2, check=True, timeout=240, echo=lines.append)
    assert result.ok, "\n".join(lines)
    assert all(step["passed"] and step["max_relative_difference"] <= 1e-4 for step in result.steps)
