"""Moving tensors between the copies of the step: the conversions of tag_core.emit.graph.

A tensor is seen by a consumer copy the way its kind (tag_core.emit.analysis) says: rows sliced out or
concatenated, partial values summed (TF collectives inside a placement, AddN across placements,
gradients fused into buckets when the strategy asks), statistics weighted by batch share, invariant
values taken from the nearest copy.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from tag_core.errors import TagInputError

from .analysis import BATCH, FLOATS, INVARIANT, PARTIAL, STAT, TensorFacts
from .nodes import parse_input, tensor_name


@dataclass(frozen=True)
class Context:
    """One copy: replica `replica` of placement `pid`, in the local (sub-batch) or global view."""

    pid: int
    replica: int
    local: bool


@dataclass
class Collective:
    node: str
    device: str
    tensor: str  # the original tensor it reduces
    group_key: int
    instance_key: int
    group: list[str]  # devices taking part
    ready: int  # position in the step's order of the last op whose output goes into it: the launch order


class Transfers:
    """Mixin of GraphBuilder (it supplies placed, devices, sink, copy, contexts, device_of, facts, ...)."""

    # ---- moving tensors between copies ---------------------------------------------

    def convert(self, src: str, index: int, ctx: Context, device: int) -> str:
        """Tensor `src:index` as copy `ctx` (on `device`) must see it."""
        pid = self.placed.op_pid[src]
        src_local = self.local(src)
        if pid == ctx.pid and src_local == ctx.local:
            return tensor_name(self.copy(src, Context(pid, ctx.replica, src_local)), index)
        key = (src, index, ctx, device)
        if key not in self.converted:
            self.converted[key] = self._convert(src, index, ctx, device, pid, src_local)
        return self.converted[key]

    def _convert(self, src: str, index: int, ctx: Context, device: int, pid: int, src_local: bool) -> str:
        facts = self.facts(src, index)
        producer = self.placed.placements[pid]
        consumer = self.placed.placements[ctx.pid]
        own = [(tensor_name(self.copy(src, c), index), self.device_of(src, c), c.replica) for c in self.contexts(src)]
        dev = self.devices[device]
        if not src_local:  # every copy holds the full-batch value
            name, at, _ = self._nearest(own, device)
            if ctx.local and facts.kind == BATCH:
                lo, hi = consumer.rows(ctx.replica)
                return self._rows(name, facts, lo, hi, self.batch, at, src)
            if ctx.local and facts.kind == PARTIAL:
                return self.sink.scale(name, consumer.weight(ctx.replica), facts.dtype, dev)
            return name
        if facts.kind == BATCH:
            lo, hi = consumer.rows(ctx.replica) if ctx.local else (0, self.batch)
            pieces = []
            for name, at, k in own:
                a, b = producer.rows(k)
                if max(lo, a) < min(hi, b):
                    if b - a == 1 and facts.axis >= 0 and min(facts.shape) > 0:
                        # A one-row copy may have lost its batch axis to broadcasting (TF sums size-1 axes).
                        shape = tuple(facts.per_sample if i == facts.axis else n for i, n in enumerate(facts.shape))
                        name = self.sink.reshape(name, shape, facts.dtype, self.devices[at])
                    pieces.append(self._rows(name, facts, max(lo, a) - a, min(hi, b) - a, b - a, at, src))
            return self.sink.concat(pieces, facts.axis, facts.dtype, dev)
        if facts.kind == INVARIANT:
            return self._nearest(own, device)[0]
        self._need_float(facts, src, index)
        weighted = facts.kind == STAT
        if pid == ctx.pid:  # local -> global inside one placement: a collective over its replicas
            return self._all_reduce(src, index, facts, own, producer, weighted)[ctx.replica]
        parts = [self.sink.scale(name, producer.weight(k) if weighted else 1.0, facts.dtype, self.devices[at])
                 for name, at, k in own]
        total = self.sink.add_n(parts, facts.dtype, dev)
        if ctx.local and not weighted:
            return self.sink.scale(total, consumer.weight(ctx.replica), facts.dtype, dev)
        return total

    def _nearest(self, own: list[tuple[str, int, int]], device: int) -> tuple[str, int, int]:
        at = self._nearest_device([d for _, d, _ in own], device)
        return next(item for item in own if item[1] == at)

    def _rows(self, name: str, facts: TensorFacts, lo: int, hi: int, rows: int, device: int, src: str) -> str:
        if lo == 0 and hi == rows:
            return name
        if facts.axis < 0:
            raise TagInputError("plan", f"tensor {name} of op {src} must be split by rows but its batch "
                                        f"dimension is not batch-major; keep its producer and consumers in one group")
        key = ("rows", name, lo, hi)
        if key not in self.converted:
            self.converted[key] = self.sink.slice_rows(name, len(facts.shape), facts.axis, lo * facts.per_sample,
                                                       (hi - lo) * facts.per_sample, facts.dtype, self.devices[device])
        return self.converted[key]

    def _need_float(self, facts: TensorFacts, src: str, index: int) -> None:
        if facts.dtype not in FLOATS:
            raise TagInputError("plan", f"tensor {tensor_name(src, index)} ({facts.dtype}) depends on how the batch "
                                        f"is split and cannot be combined across copies; keep its producer and "
                                        f"consumers in one group")

    def _all_reduce(self, src, index, facts, own, producer, weighted: bool) -> list[str]:
        key = (src, index, weighted)
        if key not in self.reduced and not weighted and (src, index) in self.buckets:
            self._fused_all_reduce(self.buckets[(src, index)], producer)
        if key not in self.reduced:
            values = [self.sink.scale(name, producer.weight(k), facts.dtype, self.devices[at]) if weighted else name
                      for name, at, k in own]
            self.reduced[key] = self._collective(values, producer, facts.dtype, tensor_name(src, index),
                                                 self.position[src])
        return self.reduced[key]

    def _collective(self, values: list[str], producer, dtype: str, label: str, ready: int) -> list[str]:
        """One CollectiveReduceV2 (a sum) per replica of `producer` over `values`, one per replica; `ready`:
        see `Collective.ready`."""
        group = tuple(producer.devices)
        group_key = self.group_keys.setdefault(group, len(self.group_keys) + 1)
        self.instances += 1
        outs = []
        for value, at in zip(values, group):
            dev = self.devices[at]
            node = self.sink.all_reduce(value, dtype, dev, len(group), group_key, self.instances)
            self.collectives.append(Collective(node, dev, label, group_key, self.instances,
                                               [self.devices[d] for d in group], ready))
            outs.append(node)
        return outs

    # ---- gradient fusion (Horovod's tensor fusion, the strategy's fusion_bytes) --------

    def _fusion_buckets(self, fusion_bytes: int) -> dict[tuple[str, int], list[tuple[str, int]]]:
        """Dense gradients of each split placement, in the order they are produced, cut into buckets of
        about `fusion_bytes`: each bucket is then summed with one collective per replica."""
        candidates: dict[tuple[int, str], list[tuple[int, tuple[str, int], int]]] = defaultdict(list)
        for variable in self.step.variables:
            if not variable.gradient:
                continue
            src, index = parse_input(variable.gradient)
            if src not in self.kept or not self.local(src):
                continue
            pid = self.placed.op_pid[src]
            facts = self.facts(src, index)
            if (self.placed.placements[pid].replicas < 2 or facts.kind != PARTIAL or facts.dtype not in FLOATS
                    or facts.shape != tuple(variable.shape)):
                continue
            nbytes = int(np.prod(facts.shape, dtype=np.int64)) * np.dtype(facts.dtype).itemsize
            candidates[(pid, facts.dtype)].append((self.position[src], (src, index), nbytes))
        buckets: dict[tuple[str, int], list[tuple[str, int]]] = {}
        for members in candidates.values():
            current: list[tuple[str, int]] = []
            size = 0
            for _, tensor, nbytes in sorted(set(members)):
                current.append(tensor)
                size += nbytes
                if size >= fusion_bytes:
                    buckets.update({t: current for t in current})
                    current, size = [], 0
            buckets.update({t: current for t in current})
        return buckets

    def _fused_all_reduce(self, bucket: list[tuple[str, int]], producer) -> None:
        """Flatten and concatenate a bucket on each replica, sum it once, split it back."""
        facts = [self.facts(src, index) for src, index in bucket]
        dtype = facts[0].dtype
        sizes = [int(np.prod(f.shape, dtype=np.int64)) for f in facts]
        pid = self.placed.op_pid[bucket[0][0]]
        flats = []
        for k, at in enumerate(producer.devices):
            dev = self.devices[at]
            parts = [self.sink.reshape(tensor_name(self.copy(src, Context(pid, k, True)), index), (-1,), dtype, dev)
                     for src, index in bucket]
            flats.append(self.sink.concat(parts, 0, dtype, dev))
        label = f"{len(bucket)} gradients from {tensor_name(*bucket[0])}"
        summed = self._collective(flats, producer, dtype, label, max(self.position[src] for src, _ in bucket))
        per_replica = []
        for total, at in zip(summed, producer.devices):
            dev = self.devices[at]
            pieces = self.sink.split_sizes(total, sizes, dtype, dev) if len(bucket) > 1 else [total]
            per_replica.append([self.sink.reshape(p, f.shape, dtype, dev) for p, f in zip(pieces, facts)])
        for j, (src, index) in enumerate(bucket):
            self.reduced[(src, index, False)] = [outs[j] for outs in per_replica]
