"""Dense segment sums in compiled regions become gathers: the same values, to the bit in TF, and under XLA; sums
that would not gain, or whose shapes are not static, are left alone."""

from __future__ import annotations

import numpy as np
import pytest

from tag_core.fusion import FusionPlan, mark_for_xla, rewrite_as_gathers

IDS = np.array([[3, 7, 3], [-1, 9, 3]], np.int32)  # repeats, and a negative id (which the sum drops)


def _sum_graph(rows: int, ids_shape=(2, 3), known: bool = True):
    """scaled = 2 * UnsortedSegmentSum(data[*ids_shape, 4, 2], ids, rows), as in an optimizer's moment update."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        shape = list(ids_shape) if known else [None] * len(ids_shape)
        data = tf.compat.v1.placeholder(tf.float32, shape + [4, 2], name="data")
        ids = tf.compat.v1.placeholder(tf.int32, shape, name="ids")
        total = tf.raw_ops.UnsortedSegmentSum(data=data, segment_ids=ids, num_segments=tf.constant(rows, name="rows"),
                                              name="sum")
        tf.raw_ops.Mul(x=total, y=tf.constant(2.0, name="two"), name="scaled")
    return graph.as_graph_def()


def _run(graph_def, data, ids=IDS):
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run(["sum:0", "scaled:0"], {"data:0": data, "ids:0": ids})


def _copy(graph_def):
    import tensorflow as tf

    copy = tf.compat.v1.GraphDef()
    copy.CopyFrom(graph_def)
    return copy


def _data():
    return np.random.default_rng(0).standard_normal([2, 3, 4, 2]).astype(np.float32)


def test_a_dense_segment_sum_in_a_region_becomes_a_gather_with_the_same_values_to_the_bit():
    graph_def = _sum_graph(rows=10)
    plain = _copy(graph_def)
    regions, rewritten = rewrite_as_gathers(graph_def, [["sum", "scaled"], ["elsewhere"]])
    assert rewritten == 1
    nodes = {node.name: node for node in graph_def.node}
    assert nodes["sum"].op == "GatherV2" and not any(node.op == "UnsortedSegmentSum" and node.name == "sum"
                                                       for node in graph_def.node)
    # The new nodes joined the sum's region, constants aside (region calls copy those); the other region is as was.
    assert "scaled" in regions[0] and "sum" in regions[0] and regions[1] == ["elsewhere"]
    assert any(nodes[name].op == "UnsortedSegmentMin" for name in regions[0])
    assert not any(nodes[name].op == "Const" for name in regions[0])
    data = _data()
    for want, got in zip(_run(plain, data), _run(graph_def, data)):
        np.testing.assert_array_equal(want, got)
    assert np.count_nonzero(_run(graph_def, data)[0].reshape(10, -1).any(axis=1)) == 3  # rows 3, 7, 9


def test_a_rewritten_sum_compiled_as_a_region_call_computes_what_the_plain_sum_does():
    graph_def = _sum_graph(rows=10)
    plain = _copy(graph_def)
    plan = FusionPlan("sums", [], 2, 2, 0.0, "", regions=[["sum", "scaled"]])
    marked = mark_for_xla(graph_def, plan, ["sum:0", "scaled:0"])
    assert marked["segment_sums_as_gathers"] == 1 and marked["calls"] == 1
    assert [node.op for node in graph_def.node if node.name == "sum"] == ["Identity"]  # a fetch stub of the call
    data = _data()
    for want, got in zip(_run(plain, data), _run(graph_def, data)):
        np.testing.assert_allclose(want, got, rtol=1e-6)


@pytest.mark.parametrize("case", ["no more rows out than in", "shapes not static", "not in a region"])
def test_a_sum_that_would_not_gain_or_has_no_static_shapes_is_left_alone(case):
    graph_def = {"no more rows out than in": lambda: _sum_graph(rows=6),
                 "shapes not static": lambda: _sum_graph(rows=10, known=False),
                 "not in a region": lambda: _sum_graph(rows=10)}[case]()
    regions = [] if case == "not in a region" else [["sum", "scaled"]]
    before = graph_def.SerializeToString()
    assert rewrite_as_gathers(graph_def, regions) == (regions, 0)
    assert graph_def.SerializeToString() == before


@pytest.mark.slow
def test_a_text_models_step_with_its_embedding_sums_as_gathers_trains_as_the_plain_step():
    """A small BERT's Adam reads its token embedding's gradient as two dense sums: both become gathers, and two
    steps compiled as a region give the loss and the parameters of the plain step."""
    import tensorflow as tf

    from tag_core.capture import capture, resolve_model, synthetic_batch
    from tag_core.fusion import compiled_regions, session_config, step_fetches
    from tag_core.profile import initialise_randomly

    spec = resolve_model("bert_base[layers=1,hidden=16,heads=2,ff=32,vocab=300,seq_len=8]", 4)
    step = capture(spec).step
    fetches = step_fetches(step)
    plan = FusionPlan(spec.name, [], 0, 0, 0.0, "", regions=compiled_regions(step.graph_def, set(), fetches))
    marked_graph = _copy(step.graph_def)
    marked = mark_for_xla(marked_graph, plan, fetches)
    assert marked["segment_sums_as_gathers"] == 2 and marked["calls"] >= 1
    embedding = next(v.handle_node for v in step.variables if v.shape == (300, 16) and v.owner == "model")
    feed_values = synthetic_batch(spec, 4)

    def train(graph_def, config):
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
            read = tf.raw_ops.ReadVariableOp(resource=graph.get_tensor_by_name(f"{embedding}:0"), dtype=tf.float32)
        with tf.compat.v1.Session(graph=graph, config=config) as session:
            initialise_randomly(session, step)
            losses = [session.run([step.loss_tensor, step.train_ops], dict(zip(step.input_tensors, feed_values)))[0]
                      for _ in range(2)]
            return losses, session.run(read)

    (plain_losses, plain_table), (losses, table) = train(step.graph_def, None), train(marked_graph, session_config(plan))
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-4)
    np.testing.assert_allclose(table, plain_table, rtol=1e-4, atol=1e-6)
