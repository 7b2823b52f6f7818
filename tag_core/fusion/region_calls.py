"""Compiled regions as must-compile function calls: one XLA launch per region, variables updated in place.

Marking a region's nodes `_XlaCompile` hands them to TF's clustering pass, which runs them as `_XlaCompile`/`_XlaRun`.
That path has two costs on a training step. Its resource-safety analysis splits a region wherever a variable is
read after a write (Keras' Adam writes each moment, then reads it back), and it never aliases a variable's new
value with its old buffer, so every step writes each updated variable (and each optimizer slot) to a fresh buffer.
`tf.function(jit_compile=True)` has neither: its call runs through `XlaLocalLaunch`, which compiles the body in
program order and aliases resource updates. So each region here becomes the body of a function and the region's
nodes one `StatefulPartitionedCall` with `_XlaMustCompile`, as jit's own call is. On a 2-layer BERT step the region
compiled as one program with 119 in-place variable updates, the same HLO as jit's (within two fusions).

The rest of the graph is rewired to the call: tensors used outside become its outputs, control edges point at it,
and each name the caller fetches stays fetchable (an `Identity` of the call's output for a tensor, a `NoOp` after
the call for an op). A region is first split until contracting it leaves the graph acyclic (no path may leave it
and come back through another node), and constants without inputs are copied into every body that reads them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tag_core.capture.graph import input_node, reachable

CALL_PREFIX = "tag_region"


@dataclass
class RegionCalls:
    calls: list[str] = field(default_factory=list)  # call node names
    ops: list[int] = field(default_factory=list)  # nodes compiled in each call
    splits: int = 0  # times a region was split to keep the graph acyclic
    left: int = 0  # regions left as plain ops: their body could not be traced as a function

    def to_json(self) -> dict:
        return {"calls": len(self.calls), "ops_compiled": sum(self.ops), "splits": self.splits, "left": self.left}


def compile_as_calls(graph_def, regions: list[list[str]], fetches: list[str]) -> RegionCalls:
    """Replace each region (node names, all on one device) of `graph_def` by one must-compile function call, in
    place. `fetches`: names the caller will run or fetch (`op` or `op:k`); they stay in the graph."""
    graph = _Graph(graph_def)
    done = RegionCalls()
    pending = [set(region) for region in regions]
    while pending:
        members = pending.pop(0) & set(graph.nodes)
        if len(members) < 2:
            continue
        between = graph.between(members)
        if between:  # contracting would make a cycle: split off what reaches the nodes in between
            first = members & reachable(between, graph.predecessors)
            pending[:0] = [first, members - first]
            done.splits += 1
            continue
        name = graph.unique(f"{CALL_PREFIX}_{len(done.calls)}")
        if graph.contract(members, name, fetches):
            done.calls.append(name)
            done.ops.append(len(members))
        else:
            done.left += 1
    graph.write_back()
    return done


def _add(items: list, item) -> None:
    if item not in items:
        items.append(item)


def _tensor(text: str) -> str:
    name, _, index = text.partition(":")
    return f"{name}:{index or 0}"


def _free_constant(node) -> bool:
    return node.op == "Const" and not node.input


class _Graph:
    """The GraphDef's nodes by name with their edges, kept current as regions are contracted."""

    def __init__(self, graph_def):
        import tensorflow as tf

        self.graph_def = graph_def
        self.nodes = {node.name: node for node in graph_def.node}
        self.order = list(self.nodes)
        self.successors: dict[str, set[str]] = defaultdict(set)
        self.predecessors: dict[str, set[str]] = defaultdict(set)
        for node in graph_def.node:
            self._link(node)
        imported = tf.Graph()
        with imported.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
        self.tf_graph = imported
        self.known: dict[str, tuple] = {}  # tensor -> (dtype, shape) of call outputs

    def _link(self, node) -> None:
        for text in node.input:
            source = input_node(text)
            self.successors[source].add(node.name)
            self.predecessors[node.name].add(source)

    def _unlink_inputs(self, name: str) -> None:
        for source in self.predecessors.pop(name, ()):
            self.successors[source].discard(name)

    def _remove(self, name: str) -> None:
        self._unlink_inputs(name)
        for target in self.successors.pop(name, ()):
            self.predecessors[target].discard(name)
        del self.nodes[name]

    def between(self, members: set[str]) -> set[str]:
        """Nodes outside `members` on a path from one member to another."""
        return (reachable(members, self.successors) & reachable(members, self.predecessors)) - members

    def unique(self, name: str) -> str:
        candidate, k = name, 0
        while candidate in self.nodes:
            k += 1
            candidate = f"{name}_{k}"
        return candidate

    def tensor_type(self, tensor: str):
        """(dtype, shape) of a tensor of the original graph or of an earlier call."""
        if tensor in self.known:
            return self.known[tensor]
        found = self.tf_graph.get_tensor_by_name(tensor)
        return found.dtype, found.shape

    def contract(self, members: set[str], name: str, fetches: list[str]) -> bool:
        """Replace `members` by a call named `name`; False (and the graph unchanged) if the body does not trace."""
        import tensorflow as tf

        nodes = self.nodes
        constants = {s for m in members for s in map(input_node, nodes[m].input) if _free_constant(nodes[s])} - members
        inside = members | constants
        body = [n for n in self.order if n in inside]
        inputs, control_inputs = [], []
        for text in (t for n in body for t in nodes[n].input if input_node(t) not in inside):
            if text.startswith("^"):
                _add(control_inputs, "^" + input_node(text))
            else:
                _add(inputs, _tensor(text))
        outside = sorted(set().union(*(self.successors[m] for m in members)) - members)
        outputs = []  # what outside nodes read, then the tensors the caller fetches
        for text in (t for target in outside for t in nodes[target].input):
            if not text.startswith("^") and input_node(text) in members:
                _add(outputs, _tensor(text))
        fetched = [f for f in fetches if input_node(f) in members]
        for fetch in fetched:
            if ":" in fetch:
                _add(outputs, _tensor(fetch))
        input_types = [self.tensor_type(t) for t in inputs]
        if any(dtype != dtype.base_dtype for dtype, _ in input_types):
            return False  # v1 reference variables cannot be function arguments
        specs = [tf.TensorSpec(shape, dtype) for dtype, shape in input_types]
        try:
            function = _trace_body([nodes[n] for n in body], inside, inputs, outputs, specs, self.graph_def.versions)
        except (ValueError, TypeError, tf.errors.OpError):
            return False
        self._add_to_library(function)
        output_types = [self.tensor_type(t) for t in outputs]
        devices = {nodes[m].device for m in members}
        call = _call_node(name, function.signature.name, inputs + control_inputs, specs, output_types,
                          devices.pop() if len(devices) == 1 else "")
        position = {tensor: k for k, tensor in enumerate(outputs)}
        self.known.update({f"{name}:{k}": output_types[k] for k in range(len(outputs))})
        fetched_names = {input_node(f) for f in fetches}
        removed = members | {c for c in constants if self.successors[c] <= members and c not in fetched_names}
        for m in removed:  # the members, and constants only they read (the body has its copies)
            self._remove(m)
        added = [call, *_stubs(call, fetched, position, output_types)]
        for node in outside:
            _rewire(nodes[node], members, name, position)
            self._unlink_inputs(node)
        for node in added:
            nodes[node.name] = node
        for node in [*(nodes[t] for t in outside), *added]:
            self._link(node)
        self.order = [n for n in self.order if n not in removed] + [node.name for node in added]
        for node in nodes.values():  # a node colocated with a member loses that constraint
            _drop_colocation(node, members)
        return True

    def _add_to_library(self, function) -> None:
        library = self.graph_def.library
        if not any(f.signature.name == function.signature.name for f in library.function):
            library.function.add().CopyFrom(function)

    def write_back(self) -> None:
        nodes = [self.nodes[name] for name in self.order]
        copies = [type(node)() for node in nodes]
        for copy, node in zip(copies, nodes):
            copy.CopyFrom(node)
        del self.graph_def.node[:]
        self.graph_def.node.extend(copies)


def _call_node(name: str, function: str, inputs: list[str], specs, output_types, device: str):
    """`StatefulPartitionedCall` of `function` marked `_XlaMustCompile`, as `tf.function(jit_compile=True)` calls."""
    import tensorflow as tf

    call = tf.compat.v1.NodeDef(name=name, op="StatefulPartitionedCall", input=inputs, device=device)
    call.attr["f"].func.name = function
    call.attr["Tin"].list.type.extend(spec.dtype.as_datatype_enum for spec in specs)
    call.attr["Tout"].list.type.extend(dtype.as_datatype_enum for dtype, _ in output_types)
    call.attr["_XlaMustCompile"].b = True
    for key in ("config", "config_proto", "executor_type"):
        call.attr[key].s = b""
    return call


def _stubs(call, fetched: list[str], position: dict[str, int], output_types) -> list:
    """What keeps the fetched names of the call's members: an Identity of the call's output for a tensor (`op:k`),
    a NoOp after the call for an op."""
    import tensorflow as tf

    stubs = {}
    for fetch in sorted(fetched, key=lambda f: ":" not in f):  # tensors first: an Identity also runs as the op
        name = input_node(fetch)
        if name in stubs:
            continue
        if ":" in fetch:
            k = position[_tensor(fetch)]
            stubs[name] = tf.compat.v1.NodeDef(name=name, op="Identity", device=call.device, input=[f"{call.name}:{k}"])
            stubs[name].attr["T"].type = output_types[k][0].as_datatype_enum
        else:
            stubs[name] = tf.compat.v1.NodeDef(name=name, op="NoOp", device=call.device, input=["^" + call.name])
    return list(stubs.values())


def _rewire(node, members: set[str], call: str, position: dict[str, int]) -> None:
    """`node`'s inputs from `members` taken from the call instead."""
    rewired = []
    for text in node.input:
        if input_node(text) not in members:
            rewired.append(text)
        elif text.startswith("^"):
            _add(rewired, "^" + call)
        else:
            rewired.append(f"{call}:{position[_tensor(text)]}")
    del node.input[:]
    node.input.extend(rewired)


def _drop_colocation(node, members: set[str]) -> None:
    if "_class" not in node.attr:
        return
    kept = [c for c in node.attr["_class"].list.s if c.decode().removeprefix("loc:@") not in members]
    if kept:
        del node.attr["_class"].list.s[:]
        node.attr["_class"].list.s.extend(kept)
    else:
        del node.attr["_class"]


def _trace_body(nodes: list, inside: set[str], inputs: list[str], outputs: list[str], specs, versions):
    """The FunctionDef of a jit-compiled function that computes `outputs` from `inputs` with these nodes."""
    import tensorflow as tf

    body = tf.compat.v1.GraphDef()
    body.versions.CopyFrom(versions)
    for node in nodes:
        copy = body.node.add()
        copy.CopyFrom(node)
        del copy.input[:]
        copy.input.extend(t for t in node.input if not t.startswith("^") or input_node(t) in inside)
        copy.device = ""
        for key in ("_class", "_XlaCompile", "_XlaScope", "_XlaSeparateCompiledGradients"):
            if key in copy.attr:
                del copy.attr[key]

    def region(*args):
        return tf.compat.v1.import_graph_def(body, input_map=dict(zip(inputs, args)), return_elements=outputs,
                                             name="")

    traced = tf.function(region, jit_compile=True, autograph=False).get_concrete_function(*specs)
    return traced.function_def
