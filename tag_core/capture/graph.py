"""OpGraph: the training step TAG plans over.

Built from two traces of the step (at batch B and B+1): shapes that differ
between them carry the batch dimension. Ops that cost nothing (constants,
identities, variable handles, shape arithmetic, no-ops) are removed, and the
dependencies that ran through them are kept as direct edges.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, fields

import numpy as np

from .trace import INIT_SCOPE, TracedStep

# Ops that forward their input unchanged: a bridge over them carries the same tensor.
PASS_THROUGH = {"Identity", "IdentityN", "Snapshot", "StopGradient", "PreventGradient", "EnsureShape"}
# Ops that never cost anything at run time.
FREE = PASS_THROUGH | {"Const", "NoOp", "VarHandleOp", "Shape", "ShapeN", "Size", "Rank"}
# Optimizer variables read or written only by the update: their reads are part of "apply".
STATEFUL_WRITES = {"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "ResourceApplyAdam"}


@dataclass
class Op:
    name: str
    type: str
    output_bytes: int
    flops: int
    parameter_bytes: int = 0
    is_parameter: bool = False  # reads a model variable
    is_gradient: bool = False  # part of the backward pass
    is_apply: bool = False  # part of the optimizer update
    is_input: bool = False  # a model input or the label
    batch_scaled: bool = False  # some output carries the batch dimension
    variable: str | None = None  # the variable it reads or writes
    # Further variables it takes handles of (a loop or function call over several, such as an LSTM's
    # kernels): all must live on its devices, so grouping keeps them with it.
    other_variables: tuple[str, ...] = ()


@dataclass
class Edge:
    src: int
    dst: int
    bytes: int
    batch: bool  # the tensor carries the batch dimension
    tensor: str  # "producer:index", or "" for a pure dependency


@dataclass
class Variable:
    name: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    trainable: bool
    owner: str  # "model" or "optimizer"
    gradient_op: str | None  # the OpGraph op that produces its gradient


@dataclass
class OpGraph:
    model: str
    batch_size: int
    ops: list[Op]
    edges: list[Edge]
    variables: list[Variable]

    def __post_init__(self):
        self.index = {op.name: i for i, op in enumerate(self.ops)}

    @property
    def parameter_count(self) -> int:
        return sum(int(np.prod(v.shape, dtype=np.int64)) for v in self.variables if v.owner == "model" and v.trainable)

    @property
    def parameter_bytes(self) -> int:
        return sum(v.bytes for v in self.variables if v.owner == "model" and v.trainable)

    def summary(self) -> dict:
        return {
            "model": self.model,
            "batch_size": self.batch_size,
            "ops": len(self.ops),
            "edges": len(self.edges),
            "parameters": self.parameter_count,
            "parameter_bytes": self.parameter_bytes,
            "variables": len(self.variables),
            "parameter_ops": sum(op.is_parameter for op in self.ops),
            "gradient_ops": sum(op.is_gradient for op in self.ops),
            "apply_ops": sum(op.is_apply for op in self.ops),
            "input_ops": sum(op.is_input for op in self.ops),
            "flops_per_step": sum(op.flops for op in self.ops),
            "batch_edges": sum(e.batch for e in self.edges),
            "hash": self.content_hash(),
        }

    def content_hash(self) -> str:
        digest = hashlib.sha256(f"{self.model}|{self.batch_size}".encode())
        for op in self.ops:
            record = astuple_fast(op)
            digest.update(repr(record if op.other_variables else record[:-1]).encode())  # hashes from before the field hold
        for edge in self.edges:
            digest.update(repr(astuple_fast(edge)).encode())
        return digest.hexdigest()[:16]

    def topological_order(self) -> list[int]:
        """Kahn's order; ties broken by op index so the result is deterministic."""
        import heapq

        indegree = np.zeros(len(self.ops), dtype=np.int64)
        successors: list[list[int]] = [[] for _ in self.ops]
        for edge in self.edges:
            successors[edge.src].append(edge.dst)
            indegree[edge.dst] += 1
        ready = [i for i in range(len(self.ops)) if indegree[i] == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for j in successors[i]:
                indegree[j] -= 1
                if indegree[j] == 0:
                    heapq.heappush(ready, j)
        if len(order) != len(self.ops):
            raise ValueError(f"{self.model}: the op graph has a cycle")
        return order


def astuple_fast(record) -> tuple:
    return tuple(getattr(record, f.name) for f in fields(record))


def records(items) -> list[dict]:
    return [asdict(item) for item in items]


def op_graph_to_json(graph: OpGraph) -> dict:
    """`graph` as JSON-ready data: the records the store saves (tag_core.store.graphs), for a child process's
    capture to hand back without pickles."""
    return {"model": graph.model, "batch_size": graph.batch_size, "ops": records(graph.ops),
            "edges": records(graph.edges), "variables": records(graph.variables)}


def op_graph_from_json(data: dict) -> OpGraph:
    """The OpGraph `op_graph_to_json` wrote; tuples come back as tuples, unknown keys are refused."""
    def build(cls, row: dict):
        names = {f.name for f in fields(cls)}
        if not set(row) <= names:
            raise ValueError(f"{cls.__name__} record has unknown fields {sorted(set(row) - names)}")
        return cls(**row)

    ops = [build(Op, {**row, "other_variables": tuple(row.get("other_variables", ()))}) for row in data["ops"]]
    edges = [build(Edge, row) for row in data["edges"]]
    variables = [build(Variable, {**row, "shape": tuple(row["shape"])}) for row in data["variables"]]
    return OpGraph(model=data["model"], batch_size=data["batch_size"], ops=ops, edges=edges, variables=variables)


def build_op_graph(step: TracedStep, bigger: TracedStep) -> OpGraph:
    """Simplify `step` into an OpGraph; `bigger` is the same step traced at another batch size."""
    nodes = [n for n in step.graph_def.node if not n.name.startswith(INIT_SCOPE + "/")]
    by_name = {n.name: n for n in nodes}
    missing = set(by_name) - set(bigger.output_shapes)
    if missing:
        raise ValueError(f"{step.model}: traces at two batch sizes differ in ops, e.g. {sorted(missing)[:3]}")

    def tensor_info(tensor: str, trace: TracedStep):
        name, _, index = tensor.partition(":")
        return trace.output_shapes[name][int(index or 0)]

    def tensor_bytes(tensor: str) -> int:
        shape, dtype = tensor_info(tensor, step)
        if any(d < 0 for d in shape):
            return 0
        return int(np.prod(shape, dtype=np.int64)) * _itemsize(dtype)

    def carries_batch(tensor: str) -> bool:
        return tensor_info(tensor, step)[0] != tensor_info(tensor, bigger)[0]

    # Inputs of each node: (producer, output index) or (producer, -1) for a control input.
    inputs: dict[str, list[tuple[str, int]]] = {}
    for node in nodes:
        parsed = []
        for text in node.input:
            if text.startswith("^"):
                parsed.append((text[1:], -1))
            else:
                name, _, index = text.partition(":")
                parsed.append((name, int(index or 0)))
        inputs[node.name] = parsed

    input_nodes = {t.split(":")[0] for t in step.input_tensors}
    free = _free_nodes(nodes, inputs, step, input_nodes)

    # Resolve each consumed tensor through removed nodes to the kept ops it depends on.
    memo: dict[tuple[str, int], list[tuple[str, int]]] = {}

    def sources(name: str, index: int) -> list[tuple[str, int]]:
        key = (name, index)
        if key in memo:
            return memo[key]
        if name not in free:
            result = [(name, index)]
        elif by_name[name].op in PASS_THROUGH and index >= 0:
            data_inputs = [i for i in inputs[name] if i[1] >= 0]
            forwarded = data_inputs[index] if by_name[name].op == "IdentityN" else data_inputs[0]
            result = sources(*forwarded) + [
                (src, -1) for producer in inputs[name] if producer[1] < 0 for src, _ in sources(*producer)
            ]
        else:  # shape arithmetic and no-ops pass on only their dependencies
            result = [(src, -1) for producer in inputs[name] for src, _ in sources(*producer)]
        memo[key] = list(dict.fromkeys(result))
        return memo[key]

    kept = [n for n in nodes if n.name not in free]
    index_of = {n.name: i for i, n in enumerate(kept)}
    edges: dict[tuple[int, int, str], Edge] = {}
    for node in kept:
        dst = index_of[node.name]
        for producer in inputs[node.name]:
            for src_name, src_index in sources(*producer):
                src = index_of[src_name]
                if src == dst:
                    continue
                tensor = f"{src_name}:{src_index}" if src_index >= 0 else ""
                key = (src, dst, tensor)
                if key not in edges:
                    edges[key] = Edge(
                        src=src,
                        dst=dst,
                        bytes=tensor_bytes(tensor) if tensor else 0,
                        batch=carries_batch(tensor) if tensor else False,
                        tensor=tensor,
                    )
    # A data edge makes a control edge between the same pair redundant.
    data_pairs = {(e.src, e.dst) for e in edges.values() if e.tensor}
    edge_list = [e for e in edges.values() if e.tensor or (e.src, e.dst) not in data_pairs]
    edge_list.sort(key=lambda e: (e.src, e.dst, e.tensor))

    ops = _classify(kept, inputs, step, bigger, input_nodes, index_of, edge_list, sources)
    variables = _variables(step, sources, index_of, kept)
    return OpGraph(model=step.model, batch_size=step.batch_size, ops=ops, edges=edge_list, variables=variables)


def _itemsize(dtype: str) -> int:
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return {"bfloat16": 2, "resource": 0, "variant": 0, "string": 8}.get(dtype, 4)


def _free_nodes(nodes, inputs, step: TracedStep, input_nodes: set[str]) -> set[str]:
    """Nodes that cost nothing: FREE types, and integer arithmetic over free nodes only (shape math)."""
    free: set[str] = set()
    for node in nodes:  # GraphDefs from tf.function are in topological order
        if node.name in input_nodes:
            continue
        if node.op in FREE:
            free.add(node.name)
            continue
        data = [name for name, index in inputs[node.name] if index >= 0]
        outputs = step.output_shapes.get(node.name, [])
        integer_outputs = outputs and all(dtype in ("int32", "int64") for _, dtype in outputs)
        if data and integer_outputs and all(name in free for name in data) and node.op not in STATEFUL_WRITES:
            if "Variable" not in node.op and "Random" not in node.op:
                free.add(node.name)
    return free


def _classify(kept, inputs, step, bigger, input_nodes, index_of, edges, sources) -> list[Op]:
    variables = {v.handle_node: v for v in step.variables}
    # Ancestors of the loss are the forward pass; ancestors of gradients that are not, the backward.
    predecessors: list[list[int]] = [[] for _ in kept]
    successors: list[list[int]] = [[] for _ in kept]
    for e in edges:
        predecessors[e.dst].append(e.src)
        successors[e.src].append(e.dst)
    loss_op = sources(*_split(step.loss_tensor))[0][0]
    forward = reachable([index_of[loss_op]], predecessors)
    gradient_roots = [
        index_of[src] for v in step.variables if v.gradient for src, _ in sources(*_split(v.gradient))
    ]
    backward = reachable(gradient_roots, predecessors) - forward
    optimizer_reads = [
        i for i, node in enumerate(kept)
        if any(variables.get(name) is not None and variables[name].owner == "optimizer" for name, _ in inputs[node.name])
    ]
    after_gradients = reachable(list(backward) + optimizer_reads, successors) - backward - forward

    ops = []
    for i, node in enumerate(kept):
        out = step.output_shapes.get(node.name, [])
        out_bytes = sum(
            int(np.prod(shape, dtype=np.int64)) * _itemsize(dtype) for shape, dtype in out if all(d >= 0 for d in shape)
        )
        grown = [a[0] != b[0] for a, b in zip(out, bigger.output_shapes.get(node.name, []))]
        handles = list(dict.fromkeys(name for name, index in inputs[node.name] if variables.get(name) is not None))
        variable = variables.get(handles[0]) if handles else None
        is_parameter = node.op == "ReadVariableOp" and variable is not None and variable.owner == "model"
        touches_optimizer = variable is not None and variable.owner == "optimizer"
        writes = node.op in STATEFUL_WRITES
        ops.append(
            Op(
                name=node.name,
                type=node.op,
                output_bytes=out_bytes,
                flops=step.flops.get(node.name, 0),
                parameter_bytes=variable.bytes if is_parameter else 0,
                is_parameter=is_parameter,
                is_gradient=i in backward and not is_parameter and node.name not in input_nodes,
                is_apply=(i in after_gradients or touches_optimizer or (writes and i not in forward))
                and i not in backward,
                is_input=node.name in input_nodes,
                batch_scaled=any(grown),
                variable=variable.name if variable else None,
                other_variables=tuple(variables[h].name for h in handles[1:]),
            )
        )
    return ops


def _split(tensor: str) -> tuple[str, int]:
    name, _, index = tensor.partition(":")
    return name, int(index or 0)


def input_node(text: str) -> str:
    """The node a NodeDef input names: `name`, `name:k` or `^name` (a control input)."""
    return text.lstrip("^").split(":")[0]


def reachable(start, neighbours) -> set:
    """`start` and every node reachable from it; `neighbours[node]` lists a node's next nodes (a list or a dict)."""
    seen = set(start)
    stack = list(start)
    while stack:
        for j in neighbours[stack.pop()]:
            if j not in seen:
                seen.add(j)
                stack.append(j)
    return seen


def _variables(step: TracedStep, sources, index_of, kept) -> list[Variable]:
    result = []
    for v in step.variables:
        gradient_op = None
        if v.gradient:
            resolved = sources(*_split(v.gradient))
            gradient_op = resolved[0][0] if resolved else None
        result.append(
            Variable(
                name=v.name,
                shape=tuple(v.shape),
                dtype=v.dtype,
                bytes=v.bytes,
                trainable=v.trainable,
                owner=v.owner,
                gradient_op=gradient_op,
            )
        )
    return result


@dataclass
class Capture:
    graph: OpGraph
    step: TracedStep


def capture(spec, batch_size: int | None = None) -> Capture:
    """Trace `spec` at its batch size (or `batch_size`) and at one more, and build the OpGraph."""
    from .trace import build_keras, trace_step

    batch = batch_size if batch_size is not None else spec.batch_size
    keras_objects = build_keras(spec)
    step = trace_step(spec, batch, keras_objects)
    bigger = trace_step(spec, batch + 1, keras_objects)
    graph = build_op_graph(step, bigger)
    del bigger
    return Capture(graph=graph, step=step)


def copy_graph_def(graph_def):
    """A deep copy of a GraphDef (rewrites mark or cut the copy, never the captured step)."""
    import tensorflow as tf

    copy = tf.compat.v1.GraphDef()
    copy.CopyFrom(graph_def)
    return copy
