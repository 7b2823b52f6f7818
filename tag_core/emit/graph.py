"""Build the distributed GraphDef of a training step from its traces and op placements.

Every op of the step is copied once per copy of its placement (`tag/p<placement>/r<k>/...`),
each copy taken from the step traced at the copy's own batch size, so the constants TF
baked into the graph (reshape shapes, loss divisors) are right for that sub-batch.

How a tensor crosses between copies depends on what it is, which is worked out once on
the single-device step:

    batch      carries the batch dimension: sliced to the consumer's rows, concatenated
               where the consumer needs more rows than one copy holds
    partial    depends on the gradient seed (gradients, backward sums over the batch):
               each replica's value is its contribution, so copies are summed (AllReduce
               with TF collectives inside a placement, AddN across placements)
    stat       depends on the data but not the seed, no batch dimension (the loss, batch
               statistics): combined as the batch-share-weighted mean
    invariant  the same on every copy (variable reads, constants): any copy will do

Replica k of a split placement computes rows [lo_k, hi_k) and the gradient of
w_k * (its mean loss), w_k = its rows / the batch (its gradient seed is w_k instead of
1), so its backward tensors are exactly the rows and shares of the full-batch step's: sums
of replicas need no weights, and the sum of losses weighted by w_k is the full-batch mean.
(This takes the loss to be a mean over the batch, Keras' default reduction; a loss summed over
the batch would need weights of 1, and `tag run --check` reports the difference.)

Ops of the optimizer update and every op that writes a variable see "global" values:
inside a split placement each replica runs them on the summed gradient, so replicas stay
identical. Batch statistics (batch norm) are per replica; the moving averages they write
are the weighted mean over replicas.

Collectives: one CollectiveReduceV2 per replica and summed tensor (one per bucket of gradients when
the strategy fuses them, `fusion_bytes`), launched on every device in one order: that in which their
inputs are made. The moves between copies are in tag_core.emit.transfer.

Variables: an op that takes a variable handle runs where a copy of the variable lives. A
variable written by one replicated placement has a copy on each of its devices; one
written anywhere else lives on one device (the first writer's), where all its writers
go and where the reads of other devices are served from (the PS case).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tag_core.capture.graph import OpGraph
from tag_core.capture.trace import INIT_SCOPE, TracedStep
from tag_core.errors import TagInputError

from .analysis import StepAnalysis
from .nodes import NodeSink, parse_input, tensor_name
from .place import SPLIT, OpPlacements
from .transfer import Collective, Context, Transfers


@dataclass
class EmittedGraph:
    graph_def: object
    input_tensors: list[str]  # fed with the whole batch, as in the single-device step
    loss_tensor: str
    train_op: str
    init_op: str
    init_values: list[str]  # placeholder of each variable's initial value, in TracedStep.variables order
    # variable name -> [(VarHandleOp node, device, its assign from tag_init/value_i)]
    variable_copies: dict[str, list[tuple[str, str, str]]]
    collectives: list[Collective]
    seed: str | None
    # Batch statistics (batch norm) computed per replica of a split placement, their placements, and the
    # data-dependent values written to variables (moving averages): what `tag run --check` must mirror.
    stat_ops: list[str] = field(default_factory=list)
    stat_rows: tuple[int, ...] | str = ()  # rows per replica of their one placement, or why there is no one
    stat_writes: list[str] = field(default_factory=list)


class GraphBuilder(Transfers):
    def __init__(self, traces: dict[int, TracedStep], batch: int, graph: OpGraph, placed: OpPlacements,
                 devices: list[str], machines: list[int], fusion_bytes: int = 0):
        self.batch = batch
        self.step = traces[self.batch]
        probe = self.batch + 1 if self.batch + 1 in traces else next(b for b in sorted(traces) if b != self.batch)
        self.probe = traces[probe]
        self.all_traces = traces
        self.traces = {b: {n.name: n for n in t.graph_def.node if not n.name.startswith(INIT_SCOPE + "/")}
                       for b, t in traces.items()}
        self.placed, self.devices, self.machines = placed, devices, machines
        self.apply_ops = {op.name for op in graph.ops if op.is_apply}
        self.kept = set(placed.op_pid)
        self.analysis = a = StepAnalysis(self.step, self.probe, self.kept)
        self.base, self.inputs, self.input_nodes, self.order = a.base, a.inputs, a.input_nodes, a.order
        self.handles, self.free, self.resources, self.writers = a.handles, a.free, a.resources, a.writers
        self.seed, self.facts = a.seed, a.facts
        self.homes = self._variable_homes()
        self.sink = NodeSink()
        self.made: dict[tuple[str, Context], str] = {}
        self.converted: dict[tuple, str] = {}
        self.reduced: dict[tuple, list[str]] = {}
        self.handle_copies: dict[str, dict[int, str]] = defaultdict(dict)
        self.collectives: list[Collective] = []
        self.position = {name: i for i, name in enumerate(self.order)}
        self.group_keys: dict[tuple[int, ...], int] = {}
        self.buckets = self._fusion_buckets(fusion_bytes) if fusion_bytes > 0 else {}
        self.instances = 0

    def build(self) -> EmittedGraph:
        for name in self.order:
            if name in self.kept:
                for ctx in self.contexts(name):
                    self.copy(name, ctx)
        loss_src, loss_index = self.analysis.loss_source()
        at = self.device_of(loss_src, self.contexts(loss_src)[0])
        out = Context(self.placed.single(at, self.batch), 0, False)
        loss = self.convert(loss_src, loss_index, out, at)
        dtype = self.facts(loss_src, loss_index).dtype
        self.sink.add("tag/loss", "Identity", [loss], self.devices[at], {"T": ("type", dtype)})
        self._order_collectives()
        runs = [self.copy(n, c) for n in self.step.train_ops if n in self.kept for c in self.contexts(n)]
        runs += [c.node for c in self.collectives]
        self.sink.gather("tag/train", runs, self.devices[at])
        init_values, variable_copies = self._init_block()
        import tensorflow as tf

        graph_def = tf.compat.v1.GraphDef()
        graph_def.versions.CopyFrom(self.step.graph_def.versions)
        _merge_libraries(graph_def, [self.step] + [t for b, t in sorted(self.all_traces.items()) if b != self.batch])
        graph_def.node.extend(self.sink.nodes)
        stat_ops, stat_writes = self.analysis.batch_statistics(
            {n for n in self.kept if self.local(n) and self.placed.placements[self.placed.op_pid[n]].replicas > 1})
        return EmittedGraph(
            stat_ops=stat_ops,
            stat_rows=self._stat_rows(stat_ops),
            stat_writes=stat_writes,
            graph_def=graph_def,
            input_tensors=list(self.step.input_tensors),
            loss_tensor="tag/loss:0",
            train_op="tag/train",
            init_op=f"{INIT_SCOPE}/all",
            init_values=init_values,
            variable_copies=variable_copies,
            collectives=self.collectives,
            seed=self.seed,
        )

    def _stat_rows(self, stat_ops: list[str]) -> tuple[int, ...] | str:
        """The rows per replica of the placement computing the batch statistics, when it is one placement
        and the statistics stay inside it (a per-sub-batch reference then mirrors it exactly)."""
        if not stat_ops:
            return ()
        pids = {self.placed.op_pid[n] for n in self.analysis.statistics_chain(stat_ops)
                if n not in self.apply_ops and n not in self.writers}
        if len(pids) > 1:
            return "batch statistics are computed in, or used by, more than one placement"
        return self.placed.placements[pids.pop()].batches

    def _order_collectives(self) -> None:
        """Launch every device's collectives in one fixed order (NCCL deadlocks when devices start concurrent
        collectives in different orders): the order their inputs are made. Creation order follows the update
        ops, so the first layer's gradient, made last, would hold back every other one until the backward pass
        ends (the simulator starts each as soon as its input is there); measured on two local CPU tasks, a
        small_cnn dp-nccl step took 17-27% longer that way."""
        last: dict[str, str] = {}
        for c in sorted(self.collectives, key=lambda c: (c.ready, c.instance_key)):
            if c.device in last:
                self.sink.by_name[c.node].input.append("^" + last[c.device])
            last[c.device] = c.node

    def _init_block(self) -> tuple[list[str], dict[str, list[tuple[str, str, str]]]]:
        """`tag_init/value_i` feeds every copy of variable i, so replicas start identical."""
        from tensorflow.core.framework import node_def_pb2

        originals = {n.name: n for n in self.step.graph_def.node if n.name.startswith(INIT_SCOPE + "/")}
        values, copies, assigns = [], {}, []
        for i, variable in enumerate(self.step.variables):
            handles = sorted(self.handle_copies.get(variable.handle_node, {}).items())
            placeholder = node_def_pb2.NodeDef()
            placeholder.CopyFrom(originals[f"{INIT_SCOPE}/value_{i}"])
            placeholder.device = self.devices[handles[0][0] if handles else 0]
            self.sink.append(placeholder)
            values.append(placeholder.name + ":0")
            copies[variable.name] = []
            for d, h in handles:
                name = f"{INIT_SCOPE}/assign_{i}/d{d}"
                self.sink.add(name, "AssignVariableOp", [h, placeholder.name], self.devices[d],
                              {"dtype": ("type", variable.dtype)})
                assigns.append(name)
                copies[variable.name].append((h, self.devices[d], name))
        self.sink.gather(f"{INIT_SCOPE}/all", assigns, self.devices[0])
        return values, copies

    def _variable_homes(self) -> dict[str, set[int] | None]:
        """Devices holding a copy of each variable (None: unwritten, a copy wherever it is read)."""
        by_handle: dict[str, list[str]] = defaultdict(list)
        for name in self.order:
            for handle in self.resources.get(name, []):
                if name in self.writers:
                    by_handle[handle].append(name)
        homes: dict[str, set[int] | None] = {h: None for h in self.handles}
        for handle, writers in by_handle.items():
            pids = {self.placed.op_pid[w] for w in writers}
            if len(pids) > 1:  # written from several placements: one copy, all writers beside it
                device = self.placed.placements[self.placed.op_pid[writers[0]]].devices[0]
                single = self.placed.single(device, self.batch)
                for w in writers:
                    self.placed.op_pid[w] = single
                pids = {single}
            homes[handle] = set(self.placed.placements[pids.pop()].devices)
        return homes

    # ---- copies -------------------------------------------------------------------

    def local(self, name: str) -> bool:
        placement = self.placed.placements[self.placed.op_pid[name]]
        return (placement.kind == SPLIT and name not in self.apply_ops and name not in self.writers
                and name not in self.analysis.random)

    def contexts(self, name: str) -> list[Context]:
        pid = self.placed.op_pid[name]
        local = self.local(name)
        return [Context(pid, r, local) for r in range(self.placed.placements[pid].replicas)]

    def batch_of(self, ctx: Context) -> int:
        return self.placed.placements[ctx.pid].batches[ctx.replica] if ctx.local else self.batch

    def device_of(self, name: str, ctx: Context) -> int:
        device = self.placed.placements[ctx.pid].devices[ctx.replica]
        homes = [self.homes[h] for h in self.resources.get(name, []) if self.homes[h] is not None]
        if homes:
            common = set.intersection(*homes)
            if not common:
                raise TagInputError("plan", f"op {name} uses variables that live on different devices")
            if device not in common:
                device = self._nearest_device(sorted(common), device)
        return device

    def _nearest_device(self, candidates: list[int], device: int) -> int:
        if device in candidates:
            return device
        same_machine = [d for d in candidates if self.machines[d] == self.machines[device]]
        return (same_machine or candidates)[0]

    def copy(self, name: str, ctx: Context) -> str:
        """The copy of node `name` in `ctx`, created (with what it needs) on first use."""
        key = (name, ctx)
        if key in self.made:
            return self.made[key]
        batch = self.batch_of(ctx)
        node = self.traces[batch].get(name)
        if node is None:
            raise TagInputError("model", f"op {name} is missing from the step traced at batch {batch}")
        device = self.device_of(name, ctx) if name in self.kept else self.placed.placements[ctx.pid].devices[ctx.replica]
        prefix = f"tag/p{ctx.pid}/{'r' if ctx.local else 'g'}{ctx.replica}"
        new_name = name if name in self.input_nodes else f"{prefix}/{name}"
        self.made[key] = new_name
        inputs: list[str] = []
        for text in node.input:
            inputs.extend(self._resolve(text, ctx, device))
        from tensorflow.core.framework import node_def_pb2

        new = node_def_pb2.NodeDef()
        new.CopyFrom(node)
        new.name, new.device = new_name, self.devices[device]
        if "_class" in new.attr:  # colocation with original names; every copy has its own device instead
            del new.attr["_class"]
        del new.input[:]
        new.input.extend(inputs)
        if name == self.seed and ctx.local:
            self._set_seed(new, self.placed.placements[ctx.pid].weight(ctx.replica))
        self.sink.append(new)
        return new_name

    @staticmethod
    def _set_seed(node, weight: float) -> None:
        import tensorflow as tf

        value = tf.make_ndarray(node.attr["value"].tensor)
        node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto((value * weight).astype(value.dtype)))

    def handle(self, name: str, device: int) -> str:
        copies = self.handle_copies[name]
        if device not in copies:
            from tensorflow.core.framework import node_def_pb2

            new = node_def_pb2.NodeDef()
            new.CopyFrom(self.base[name])
            new.name, new.device = f"tag/var/d{device}/{name}", self.devices[device]
            if "_class" in new.attr:
                del new.attr["_class"]
            copies[device] = self.sink.append(new).name
        return copies[device]

    def _resolve(self, text: str, ctx: Context, device: int) -> list[str]:
        src, index = parse_input(text)
        if src in self.handles:
            return [("^" if index < 0 else "") + self.handle(src, device)]
        if src in self.free:
            made = self.copy(src, ctx)
            return ["^" + made] if index < 0 else [tensor_name(made, index)]
        if index >= 0:
            return [self.convert(src, index, ctx, device)]
        if self.placed.op_pid[src] == ctx.pid:  # same placement: the same replica's copy
            return ["^" + self.copy(src, Context(ctx.pid, ctx.replica, self.local(src)))]
        return ["^" + self.copy(src, c) for c in self.contexts(src)]


def _merge_libraries(graph_def, traces: list[TracedStep]) -> None:
    """Functions (loop bodies, calls) of every trace a copy came from: each names its own."""
    names: set[str] = set()
    gradients: set[str] = set()
    for trace in traces:
        library = trace.graph_def.library
        for function in library.function:
            if function.signature.name not in names:
                names.add(function.signature.name)
                graph_def.library.function.add().CopyFrom(function)
        for gradient in library.gradient:
            if gradient.function_name not in gradients:
                gradients.add(gradient.function_name)
                graph_def.library.gradient.add().CopyFrom(gradient)
