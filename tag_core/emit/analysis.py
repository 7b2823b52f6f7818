"""What the emitter needs to know about the single-device step, independent of any placement.

- the gradient seed: the constant 1 the backward pass starts from (each replica's becomes its batch share);
- per tensor (TensorFacts): does it carry the batch dimension (on which axis, how many entries per
  sample), and if not, is it a *partial* (depends on the seed: gradients and backward sums, which add up
  over replicas), a *stat* (depends on the data only: the loss, batch statistics, combined as the
  batch-share-weighted mean) or *invariant* (the same on every copy);
- batch statistics: forward ops whose batch-wide statistic feeds per-sample values (batch norm) and the
  variable writes that record such statistics (moving averages).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from tag_core.capture.graph import PASS_THROUGH
from tag_core.capture.trace import INIT_SCOPE, TracedStep

from .nodes import parse_input, tensor_name

BATCH, PARTIAL, STAT, INVARIANT = "batch", "partial", "stat", "invariant"
FLOATS = ("float16", "bfloat16", "float32", "float64")
# Ops that change a variable. Others that take a handle (reads, gathers, loops and function calls
# over variables) only read it.
WRITE_PREFIXES = ("Assign", "ResourceApply", "ResourceSparseApply", "ResourceScatter", "ResourceStridedSliceAssign")


@dataclass(frozen=True)
class TensorFacts:
    dtype: str
    shape: tuple[int, ...]  # at the global batch
    kind: str  # BATCH, PARTIAL, STAT or INVARIANT
    axis: int = -1  # batch axis (BATCH)
    per_sample: int = 0  # entries on the batch axis per sample (BATCH)


def is_random_op(op_type: str) -> bool:
    """A random draw (dropout masks, noise layers), stateful or stateless."""
    return "Random" in op_type or "Multinomial" in op_type or op_type in ("TruncatedNormal", "StatelessTruncatedNormalV2")


class StepAnalysis:
    def __init__(self, step: TracedStep, probe: TracedStep, kept: set[str]):
        """`step` at the emitted batch, `probe` at another batch size; `kept`: the OpGraph's ops."""
        self.step, self.probe, self.kept = step, probe, kept
        self.batch = step.batch_size
        self.base = {n.name: n for n in step.graph_def.node if not n.name.startswith(INIT_SCOPE + "/")}
        self.inputs = {name: [parse_input(t) for t in node.input] for name, node in self.base.items()}
        self.input_nodes = {parse_input(t)[0] for t in step.input_tensors}
        self.handles = {name for name, node in self.base.items() if node.op == "VarHandleOp"}
        self.free = set(self.base) - kept - self.handles
        self.order = topological(self.base, self.inputs)
        self.consumers: dict[str, list[str]] = defaultdict(list)
        for name, parsed in self.inputs.items():
            for src, index in parsed:
                if index >= 0:
                    self.consumers[src].append(name)
        resources = {n: [s for s, i in self.inputs[n] if i >= 0 and s in self.handles] for n in kept}
        self.resources = {n: hs for n, hs in resources.items() if hs}  # ops taking variable handles
        self.writers = {n for n in self.resources if self.base[n].op.startswith(WRITE_PREFIXES)}
        # Random draws: every copy draws the whole batch from the same seed and keeps its rows, so
        # replicas see exactly the single-device step's numbers (dropout masks).
        self.random = {n for n in kept if is_random_op(self.base[n].op)}
        self.seed = self._find_seed()
        self.variant, self.seeded = self._flags()

    def _find_seed(self) -> str | None:
        """The constant 1 the gradient starts from: a float Const that every gradient depends on
        and the loss does not (TF names it `ones`)."""
        import tensorflow as tf

        loss_ancestors = reach([self.loss_source()[0]], lambda n: [s for s, i in self.inputs[n] if i >= 0])
        gradients = {parse_input(v.gradient)[0] for v in self.step.variables if v.gradient}
        if not gradients:
            return None
        for name in self.order:
            node = self.base[name]
            if node.op != "Const" or node.input or name in loss_ancestors:
                continue
            value = tf.make_ndarray(node.attr["value"].tensor)
            if value.dtype.kind != "f" or value.size == 0 or not np.all(value == 1):
                continue
            if gradients <= reach([name], lambda n: self.consumers[n]):
                return name
        return None


    def loss_source(self) -> tuple[str, int]:
        """The kept op behind the loss tensor (the step's output is an Identity of it)."""
        name, index = parse_input(self.step.loss_tensor)
        while name in self.base and self.base[name].op in PASS_THROUGH and name not in self.kept:
            name, index = next((s, i) for s, i in self.inputs[name] if i >= 0)
        return name, index


    def _flags(self) -> tuple[set[str], set[str]]:
        variant, seeded = set(self.input_nodes), {self.seed} if self.seed else set()
        for name in self.order:
            # A variable handle is the same whatever the data, even when it passes through a loop.
            sources = [s for s, i in self.inputs[name] if i >= 0 and self._dtype(s, i) != "resource"]
            if any(s in variant for s in sources):
                variant.add(name)
            if any(s in seeded for s in sources):
                seeded.add(name)
        return variant, seeded


    def facts(self, name: str, index: int) -> TensorFacts:
        shape, dtype = self.step.output_shapes[name][index]
        other, _ = self.probe.output_shapes[name][index]
        grown = [a for a, (x, y) in enumerate(zip(shape, other)) if x != y]
        if grown:
            axis = grown[0]
            per = (other[axis] - shape[axis]) // (self.probe.batch_size - self.batch)
            if per <= 0 or shape[axis] != per * self.batch:
                axis, per = -1, 0  # not a batch-major layout: cannot be split by rows
            return TensorFacts(dtype, tuple(shape), BATCH, axis, per)
        if name in self.seeded:
            return TensorFacts(dtype, tuple(shape), PARTIAL)
        if name in self.variant:
            return TensorFacts(dtype, tuple(shape), STAT)
        return TensorFacts(dtype, tuple(shape), INVARIANT)

    def _dtype(self, name: str, index: int) -> str | None:
        outputs = self.step.output_shapes.get(name, [])
        return outputs[index][1] if index < len(outputs) else None

    def carries_batch(self, name: str) -> bool:
        return any(a[0] != b[0] for a, b in zip(self.step.output_shapes.get(name, []),
                                                self.probe.output_shapes.get(name, [])))

    def batch_statistics(self, candidates: set[str]) -> tuple[list[str], list[str]]:
        """Among `candidates`: ops computing a statistic over the batch that per-sample values then use
        (batch norm's moments), and the data-dependent values variables are assigned (moving averages)."""
        ops = []
        for name in sorted(candidates & self.variant - self.seeded):
            facts = [self.facts(name, i) for i in range(len(self.step.output_shapes.get(name, [])))]
            stat = any(f.kind == STAT and f.dtype in FLOATS for f in facts)  # not loop state (variant)
            if stat and (any(f.kind == BATCH for f in facts) or any(self.carries_batch(c) for c in self.consumers[name])):
                ops.append(name)
        writes = []
        for name in sorted(self.writers):
            for src, index in self.inputs[name]:
                if index >= 0 and src in self.kept and self.facts(src, index).kind == STAT:
                    writes.append(tensor_name(src, index) if index else f"{src}:0")
        return ops, writes

    def statistics_chain(self, stat_ops: list[str]) -> set[str]:
        """Kept ops computing the statistics of `stat_ops` (data-dependent, no batch dimension) and the
        ops using them: all of it must see one batch split for a per-sub-batch reference to hold."""
        def producers(name: str) -> list[str]:
            return [s for s, i in self.inputs[name] if i >= 0 and s in self.variant and s not in self.seeded
                    and (s in self.free or self.facts(s, i).kind == STAT)]

        chain = reach(list(stat_ops), producers)
        chain |= reach(list(stat_ops), lambda n: [c for c in self.consumers[n] if c in self.free])
        users = {c for n in chain for c in self.consumers[n]}
        return {n for n in chain | users if n in self.kept}


def topological(nodes: dict, inputs: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Kahn's order over data and control inputs, ties in GraphDef order."""
    position = {name: i for i, name in enumerate(nodes)}
    indegree = {name: 0 for name in nodes}
    consumers: dict[str, list[str]] = defaultdict(list)
    for name, parsed in inputs.items():
        for src, _ in parsed:
            if src in nodes:
                indegree[name] += 1
                consumers[src].append(name)
    import heapq

    ready = [(position[n], n) for n, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, name = heapq.heappop(ready)
        order.append(name)
        for c in consumers[name]:
            indegree[c] -= 1
            if indegree[c] == 0:
                heapq.heappush(ready, (position[c], c))
    if len(order) != len(nodes):
        raise ValueError("the traced step has a cycle")
    return order



def reach(start: list[str], neighbours) -> set[str]:
    seen, stack = set(start), list(start)
    while stack:
        for n in neighbours(stack.pop()):
            if n not in seen:
                seen.add(n)
                stack.append(n)
    return seen
