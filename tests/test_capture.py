"""Training-graph capture: the OpGraph's facts and its round trip through DuckDB."""

from __future__ import annotations

import pytest

from tag_core import store
from tag_core.capture import capture, capture_model, ensure_captured, load_op_graph, load_step, resolve_model


@pytest.fixture(scope="module")
def mlp_capture():
    return capture(resolve_model("mlp[features=20,hidden=16]", batch_size=8))


def test_mlp_graph_has_every_phase(mlp_capture):
    graph = mlp_capture.graph
    summary = graph.summary()
    # 20*16+16 + 16*16+16 + 16*10+10
    assert summary["parameters"] == 20 * 16 + 16 + 16 * 16 + 16 + 16 * 10 + 10
    assert summary["parameter_bytes"] == 4 * summary["parameters"]
    assert summary["gradient_ops"] > 0 and summary["apply_ops"] > 0 and summary["input_ops"] == 2
    types = {op.type for op in graph.ops}
    assert {"MatMul", "ReadVariableOp", "AssignSubVariableOp"} <= types
    # Free ops are gone.
    assert not types & {"Const", "Identity", "NoOp", "VarHandleOp", "Shape"}
    # A forward MatMul at batch 8 has 8*16*2*16 flops and is not a gradient op.
    first = next(op for op in graph.ops if op.type == "MatMul" and not op.is_gradient)
    assert first.flops == 2 * 8 * 20 * 16
    assert first.output_bytes == 8 * 16 * 4 and first.batch_scaled
    # Gradients are batch-free; every trainable variable has one.
    for variable in graph.variables:
        if variable.owner == "model" and variable.trainable:
            gradient = graph.ops[graph.index[variable.gradient_op]]
            assert gradient.is_gradient and not gradient.batch_scaled


def test_edges_carry_bytes_and_batch_flags(mlp_capture):
    graph = mlp_capture.graph
    images = graph.index["inputs"]
    out = [e for e in graph.edges if e.src == images]
    assert out and all(e.batch and e.bytes == 8 * 20 * 4 for e in out)
    parameter_edges = [e for e in graph.edges if graph.ops[e.src].is_parameter and e.tensor]
    assert parameter_edges and not any(e.batch for e in parameter_edges)
    graph.topological_order()  # acyclic


def test_parameter_flags_match_variables(mlp_capture):
    graph = mlp_capture.graph
    reads = [op for op in graph.ops if op.is_parameter]
    assert {op.variable for op in reads} == {v.name for v in graph.variables if v.owner == "model"}
    assert all(op.parameter_bytes > 0 for op in reads)
    assert not any(op.is_parameter for op in graph.ops if op.variable and "adam" in op.variable)


@pytest.mark.slow
def test_store_round_trip_and_step_file(tag_home):
    spec = resolve_model("small_cnn", batch_size=4)
    conn = store.connect()
    graph = capture_model(conn, spec)
    loaded = load_op_graph(conn, spec.name)
    assert loaded.ops == graph.ops and loaded.edges == graph.edges and loaded.variables == graph.variables
    assert loaded.content_hash() == graph.content_hash()
    record = store.captured_model(conn, spec.name)
    assert record["graph_hash"] == graph.content_hash()
    step = load_step(record["step_file"])
    assert step.batch_size == 4 and len(step.variables) == len(graph.variables)
    # Re-capturing replaces, never duplicates.
    capture_model(conn, spec)
    assert conn.execute("SELECT count(*) FROM ops WHERE model = ?", [spec.name]).fetchone()[0] == len(graph.ops)
    # Fresh captures are reused; a different batch size re-captures.
    assert ensure_captured(conn, spec).content_hash() == graph.content_hash()
    assert ensure_captured(conn, resolve_model("small_cnn", batch_size=6)).batch_size == 6


@pytest.mark.slow
def test_vgg19_has_the_imagenet_parameter_count():
    graph = capture(resolve_model("vgg19", batch_size=2)).graph
    summary = graph.summary()
    assert summary["parameters"] == 143_667_240
    assert summary["ops"] > 500
    assert summary["gradient_ops"] > 0 and summary["apply_ops"] > 0


@pytest.mark.slow
def test_transformer_options_capture():
    graph = capture(resolve_model("transformer[layers=1,d_model=32,heads=2,ff=64,vocab=50,seq_len=8]", 2)).graph
    types = {op.type for op in graph.ops}
    assert "BatchMatMulV2" in types or "Einsum" in types
    assert graph.summary()["gradient_ops"] > 0


@pytest.mark.slow
def test_big_models_trace_other_batch_sizes_in_a_child_process(tag_home):
    from tag_core.capture import ensure_step_files
    from tag_core.capture.steps import CHILD_TRACE_BYTES, capture_folder

    spec = resolve_model("mlp[features=6,hidden=4]", batch_size=4)
    conn = store.connect()
    graph = capture_model(conn, spec)
    files = ensure_step_files(spec, [3, 4], state_bytes=CHILD_TRACE_BYTES + 1)
    assert files[4] == capture_folder(spec.name) / "step_b4.json"  # the capture's own, not traced again
    assert load_step(store.captured_model(conn, spec.name)["step_file"]).batch_size == 4  # its published copy
    child = load_step(files[3])
    assert child.batch_size == 3 and [v.name for v in child.variables] == [v.name for v in graph.variables]


@pytest.mark.slow
def test_capture_runs_in_a_child_and_hands_back_the_same_graph(tag_home, monkeypatch):
    """The parent never builds the model (its Keras memory would stay with it): the child's OpGraph, handed
    back as JSON records, equals the one captured in this process."""
    from tag_core.capture import graph as graph_module
    from tag_core.capture import steps

    spec = resolve_model("mlp[features=6,hidden=4]", batch_size=4)
    here = capture(spec).graph

    def no_capture_here(*args, **kwargs):
        raise AssertionError("captured in the parent process")

    monkeypatch.setattr(steps, "capture", no_capture_here)
    monkeypatch.setattr(graph_module, "capture", no_capture_here)
    conn = store.connect()
    graph = capture_model(conn, spec, batches=[3])
    assert steps.in_child(spec)
    assert graph == here and graph.content_hash() == here.content_hash()
    assert load_op_graph(conn, spec.name) == here
    record = store.captured_model(conn, spec.name)
    assert load_step(record["step_file"]).batch_size == 4
    assert load_step(steps.capture_folder(spec.name) / "step_b3.json").batch_size == 3  # the same build traced it


def test_a_hand_built_spec_is_captured_in_this_process(tag_home):
    from tag_core.capture import steps

    spec = resolve_model("mlp[features=6,hidden=4]", batch_size=4)
    spec.name = "my_mlp"  # no reference a child could resolve
    assert not steps.in_child(spec)
    assert capture_model(store.connect(), spec).model == "my_mlp"


def test_the_op_graph_json_round_trip_keeps_tuples(mlp_capture):
    import json

    from tag_core.capture.graph import op_graph_from_json, op_graph_to_json

    graph = mlp_capture.graph
    again = op_graph_from_json(json.loads(json.dumps(op_graph_to_json(graph))))
    assert again == graph and again.content_hash() == graph.content_hash()
    assert all(isinstance(v.shape, tuple) for v in again.variables)
