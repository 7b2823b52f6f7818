"""Trace one training step of a ModelSpec into a TF graph that a v1 Session can run.

The step is forward + loss + gradients + optimizer update, traced with
`tf.function(...).get_concrete_function()`. Captured variable handles become
`VarHandleOp` nodes, and a `tag_init/*` block assigns initial values, so the
GraphDef runs on its own: in a Session for profiling, and on TF's distributed
runtime once placed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tag_core.errors import TagInputError  # noqa: E402

from .models.spec import ModelSpec
from .time_limit import model_timeout, time_limit

INIT_SCOPE = "tag_init"
SMALL_VARIABLE = 64  # elements; such variables keep their initial values in the step file


@dataclass
class TracedVariable:
    name: str  # the Keras variable path, unique within the model
    handle_node: str  # the VarHandleOp in the step graph
    shape: tuple[int, ...]
    dtype: str
    trainable: bool
    owner: str  # "model" or "optimizer"
    gradient: str | None = None  # tensor holding this variable's gradient
    # Values of small variables (learning rate, step counter): a step graph loaded from
    # file must start from these, not from zeros.
    initial: list | float | int | None = None

    @property
    def bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class TracedStep:
    model: str
    batch_size: int | None  # None: the graph takes any batch size
    graph_def: Any  # tf.compat.v1.GraphDef
    input_tensors: list[str]  # model inputs then the label
    loss_tensor: str
    train_ops: list[str]  # stateful ops a Session must run for one step
    init_op: str
    variables: list[TracedVariable]
    # op name -> [(shape, dtype)] for each output; unknown dimensions are -1
    output_shapes: dict[str, list[tuple[tuple[int, ...], str]]]
    flops: dict[str, int]
    keras_model: Any = field(default=None, repr=False)
    keras_optimizer: Any = field(default=None, repr=False)


def _path(variable) -> str:
    return getattr(variable, "path", None) or variable.name


def synthetic_batch(spec: ModelSpec, batch_size: int, seed: int = 0) -> list[np.ndarray]:
    """Deterministic inputs and labels for one step."""
    rng = np.random.default_rng(seed)
    arrays = []
    for item in [*spec.inputs, spec.label]:
        shape = (batch_size, *item.shape)
        if "int" in item.dtype:
            arrays.append(rng.integers(0, item.max_value or 2, size=shape).astype(item.dtype))
        else:
            arrays.append(rng.standard_normal(shape).astype(item.dtype))
    return arrays


_builds = 0  # how many times this process built a model (clearing Keras' session each time)


def builds() -> int:
    return _builds


def build_keras(spec: ModelSpec):
    """Build the model and its optimizer, turning builder failures into input errors.

    Keras numbers layer names process-wide (dense, dense_1, ...); clearing its
    session first makes op names the same in every build, so profiles taken in
    one process match a graph captured in another.
    """
    import keras

    global _builds
    _builds += 1
    keras.backend.clear_session()
    with time_limit(model_timeout(spec.timeout), f"building the Keras model of {spec.name}"):
        try:
            model = spec.build()
        except TagInputError:
            raise
        except Exception as exc:
            raise TagInputError("model", f"builder of {spec.name} raised {type(exc).__name__}: {exc}")
        optimizer = spec.make_optimizer()
        optimizer.build(model.trainable_variables)
    return model, optimizer


def trace_step(spec: ModelSpec, batch_size: int | None, keras_objects=None) -> TracedStep:
    """Trace one training step at `batch_size` (None: any batch size).

    Pass `keras_objects` to reuse a built model: op names then match across traces.
    """
    import tensorflow as tf

    if batch_size is not None and (not isinstance(batch_size, int) or batch_size <= 0):
        raise TagInputError("batch_size", f"must be a positive integer, got {batch_size!r}")
    model, optimizer = keras_objects or build_keras(spec)
    loss_fn = spec.make_loss()
    gradient_names: dict[str, str] = {}

    def step(inputs, labels):
        with tf.GradientTape() as tape:
            outputs = model(inputs if len(inputs) > 1 else inputs[0], training=True)
            loss = tf.reduce_mean(loss_fn(labels, outputs))
        trainable = model.trainable_variables
        grads = tape.gradient(loss, trainable)
        pairs = [(g, v) for g, v in zip(grads, trainable) if g is not None]
        for g, v in pairs:
            tensor = g.values if isinstance(g, tf.IndexedSlices) else g
            gradient_names[_path(v)] = tensor.name
        optimizer.apply_gradients(pairs)
        return loss

    input_specs = [tf.TensorSpec((batch_size, *i.shape), i.dtype) for i in spec.inputs]
    label_spec = tf.TensorSpec((batch_size, *spec.label.shape), spec.label.dtype)
    try:  # runs the model's own layers: bounded like its builder
        with time_limit(model_timeout(spec.timeout), f"tracing a training step of {spec.name}"):
            concrete = tf.function(step, autograph=False).get_concrete_function(input_specs, label_spec)
    except TagInputError:
        raise
    except Exception as exc:
        raise TagInputError("model", f"tracing a training step of {spec.name} failed: {type(exc).__name__}: {exc}")
    return _to_runnable(spec, batch_size, concrete, model, optimizer, gradient_names)


def _to_runnable(spec, batch_size, concrete, model, optimizer, gradient_names) -> TracedStep:
    import tensorflow as tf
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.profiler.internal import flops_registry  # noqa: F401  registers flops stats

    tf.get_logger().setLevel("ERROR")
    graph = concrete.graph
    graph_def = graph.as_graph_def()
    nodes = {node.name: node for node in graph_def.node}
    trainable_ids = {id(v) for v in model.trainable_variables}
    by_handle = {}
    for owner, collection in (("model", model.variables), ("optimizer", optimizer.variables)):
        for variable in collection:
            by_handle[id(variable.value.handle)] = (variable, owner)

    variables: list[TracedVariable] = []
    for external, internal in graph.captures:
        node = nodes[internal.op.name]
        if internal.dtype == tf.resource:
            if id(external) not in by_handle:
                raise TagInputError("model", f"{spec.name} reads a variable TAG cannot find ({internal.op.name}); create all variables in the model or optimizer")
            variable, owner = by_handle[id(external)]
            shape = tuple(int(d) for d in variable.shape)
            dtype = tf.as_dtype(variable.dtype).name
            node.op = "VarHandleOp"
            node.ClearField("attr")
            node.ClearField("input")
            node.attr["dtype"].type = tf.as_dtype(dtype).as_datatype_enum
            node.attr["shape"].shape.CopyFrom(tf.TensorShape(shape).as_proto())
            node.attr["shared_name"].s = _path(variable).encode()
            node.attr["container"].s = b""
            variables.append(
                TracedVariable(
                    name=_path(variable),
                    handle_node=node.name,
                    shape=shape,
                    dtype=dtype,
                    trainable=id(variable) in trainable_ids,
                    owner=owner,
                    gradient=gradient_names.get(_path(variable)),
                    initial=np.asarray(variable.numpy()).tolist() if int(np.prod(shape)) <= SMALL_VARIABLE else None,
                )
            )
        else:  # a captured constant
            node.op = "Const"
            node.ClearField("attr")
            node.attr["dtype"].type = internal.dtype.as_datatype_enum
            node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(external.numpy()))
    for node in graph_def.node:
        node.device = ""

    init_names = _add_init_block(graph_def, variables)
    output_shapes, flops = {}, {}
    for op in graph.get_operations():
        output_shapes[op.name] = [
            (tuple(-1 if d is None else int(d) for d in (t.shape.as_list() if t.shape.rank is not None else [])), t.dtype.name)
            for t in op.outputs
        ]
        try:
            value = tf_ops.get_stats_for_node_def(graph, op.node_def, "flops").value
        except Exception:  # not every op type has a flops registration
            value = None
        flops[op.name] = int(value or 0)

    return TracedStep(
        model=spec.name,
        batch_size=batch_size,
        graph_def=graph_def,
        input_tensors=[t.name for t in concrete.inputs[: len(spec.inputs) + 1]],
        loss_tensor=concrete.outputs[0].name,
        train_ops=sorted(op.name for op in graph.control_outputs),
        init_op=init_names,
        variables=variables,
        output_shapes=output_shapes,
        flops=flops,
        keras_model=model,
        keras_optimizer=optimizer,
    )


def _add_init_block(graph_def, variables: list[TracedVariable]) -> str:
    import tensorflow as tf

    assigns = []
    for i, variable in enumerate(variables):
        value = graph_def.node.add(name=f"{INIT_SCOPE}/value_{i}", op="Placeholder")
        value.attr["dtype"].type = tf.as_dtype(variable.dtype).as_datatype_enum
        value.attr["shape"].shape.CopyFrom(tf.TensorShape(variable.shape).as_proto())
        assign = graph_def.node.add(name=f"{INIT_SCOPE}/assign_{i}", op="AssignVariableOp")
        assign.input.extend([variable.handle_node, value.name])
        assign.attr["dtype"].type = tf.as_dtype(variable.dtype).as_datatype_enum
        assigns.append(assign.name)
    done = graph_def.node.add(name=f"{INIT_SCOPE}/all", op="NoOp")
    done.input.extend("^" + name for name in assigns)
    return done.name
