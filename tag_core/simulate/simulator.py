"""The virtual runtime: simulate one training iteration of a strategy on a topology.

`Simulator(graph, topology, profiles)` precomputes everything that does not depend on
the strategy (op order, compute-time tables, edge arrays, channels, variable facts);
`Simulator.run(strategy)` is then cheap enough for a planner to call thousands of
times. `simulate(graph, topology, strategy)` is the one-shot form.

Results are deterministic: no randomness, and every tie is broken by an index.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np
import pandas as pd

from tag_core.capture.graph import OpGraph
from tag_core.cluster.classes import machine_class_of
from tag_core.cluster.topology import Topology
from tag_core.disjoint_sets import DisjointSets
from tag_core.errors import TagInputError

from .batch_rows import RowSplits
from .comm import CommModel
from .cost import ComputeModel, activation_bytes, bytes_per_s, variable_bytes
from .engine import Schedule, comm_totals, execution_order, schedule
from .expand import edge_transfers, gradient_collectives, place, variable_pulls
from .feeds import client_cost_s, plan_feed
from .memory import group_makespans, op_times, slot_peaks
from .result import SimResult, Timeline
from .statistics import statistic_collectives
from .strategy import Strategy
from .units import concat_collectives, concat_transfers


class DevicePairs:
    """A device-by-device view of a machine-by-machine matrix: `view[a, b]` is `matrix[machine(a), machine(b)]`
    for device indices or index arrays (numpy broadcasting, as on a D x D array)."""

    def __init__(self, matrix: np.ndarray, dev_machine: np.ndarray):
        self.matrix, self.dev_machine = matrix, dev_machine
        self.shape = (len(dev_machine), len(dev_machine))

    def __getitem__(self, key: tuple) -> np.ndarray:
        a, b = key
        return self.matrix[self.dev_machine[a], self.dev_machine[b]]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self.matrix[np.ix_(self.dev_machine, self.dev_machine)]
        return out if dtype is None else out.astype(dtype)


class Simulator:
    """Strategy-independent state for one (graph, topology, profile set, batch size)."""

    def __init__(
        self,
        graph: OpGraph,
        topology: Topology,
        profiles: pd.DataFrame | None = None,
        batch_size: int | None = None,
        compute: ComputeModel | None = None,
        comm: CommModel | None = None,
        collapse: bool = True,
        statistics: Sequence[int] = (),
    ):
        """`statistics`: ops whose outputs the replicas of a split group sum each step besides the gradients
        (tag_core.simulate.statistics; the emitter's, found by tag_core.emit.prediction)."""
        self.graph, self.topology = graph, topology
        self.statistics = np.unique(np.asarray(statistics, dtype=np.int64))
        if len(self.statistics) and (self.statistics[0] < 0 or self.statistics[-1] >= len(graph.ops)):
            raise TagInputError("statistics", f"op indices must lie in [0, {len(graph.ops)})")
        # Simulate one representative device per class of interchangeable devices (engine.make_slots); False
        # simulates every device on its own (the tests' reference).
        self.collapse = collapse
        self.comm = comm or CommModel()
        self.n = len(graph.ops)
        self.batch = int(batch_size or graph.batch_size)
        self.compute = compute or ComputeModel(graph, profiles)
        scale = self.batch / graph.batch_size
        ops = graph.ops
        self.is_apply = np.array([o.is_apply for o in ops], dtype=bool)
        self.is_input = np.array([o.is_input for o in ops], dtype=bool)
        self.is_gradient = np.array([o.is_gradient for o in ops], dtype=bool)
        self.batch_scaled = np.array([o.batch_scaled for o in ops], dtype=bool)
        self.act_bytes = activation_bytes(graph) * np.where(self.batch_scaled, scale, 1.0)
        E = graph.edges
        self.e_src = np.array([e.src for e in E], dtype=np.int64)
        self.e_dst = np.array([e.dst for e in E], dtype=np.int64)
        self.e_batch = np.array([e.batch for e in E], dtype=np.int64)
        self.e_bytes = np.array([e.bytes for e in E], dtype=np.float64) * np.where(self.e_batch, scale, 1.0)
        # Each edge's tensor, numbered by (producer, name; "": its control signal), and whether other edges
        # carry it too: TF sends a tensor once to each device that consumes it (expand.edge_transfers).
        ids: dict[tuple[int, str], int] = {}
        self.e_tensor = np.array([ids.setdefault((e.src, e.tensor), len(ids)) for e in E], dtype=np.int64)
        self.e_shared = np.bincount(self.e_tensor, minlength=len(ids))[self.e_tensor] > 1
        self._topology_arrays(topology)
        # Split groups compute whole rows; spare rows go to the faster GPUs (peak FLOP/s).
        self.row_splits = RowSplits(self.batch, np.array([g.tflops for g in self.dev_gpu], dtype=np.float64))
        self.ref_time = self.compute.times(topology.devices[0].gpu, self.batch)
        self.order, self.pos, self.tail = _priority_order(self, graph)
        self._variable_facts(graph)

    # ---- precompute ----------------------------------------------------------

    def _topology_arrays(self, topo: Topology) -> None:
        self.num_devices = topo.num_devices
        M = topo.num_machines
        self.dev_machine = np.asarray(topo.device_machine)
        self.dev_gpu = [d.gpu for d in topo.devices]
        names = sorted({g.name for g in self.dev_gpu})
        self.dev_gpu_id = np.array([names.index(g.name) for g in self.dev_gpu], dtype=np.int64)
        self.capacity = np.array([g.mem_bytes for g in self.dev_gpu], dtype=np.float64)
        self.machine_bw = self.comm.machine_bandwidth(topo)
        # Device pairs look their machines up: D x D arrays would take 12·D² bytes (800 MB at 8192 GPUs).
        self.dev_bw = DevicePairs(self.machine_bw, self.dev_machine)
        # Channels: one per machine (its interconnect), one per machine pair (their link), numbered
        # machines first, then the pairs a < b in row-major order. Vectorised: 4096 machines make 8M pairs.
        chan = np.zeros((M, M), dtype=np.int32 if M < 46_000 else np.int64)  # half the memory of int64
        chan[np.arange(M), np.arange(M)] = np.arange(M)
        a, b = np.triu_indices(M, 1)
        chan[a, b] = chan[b, a] = M + np.arange(len(a))
        bps = bytes_per_s(np.concatenate([np.diag(self.machine_bw), self.machine_bw[a, b]]))
        del a, b
        self.dev_channel_m = chan
        self.dev_channel = DevicePairs(chan, self.dev_machine)
        self.channel_bps = bps
        self.num_channels = len(bps)
        self.machine_first_device = np.concatenate([[0], np.cumsum([m.count for m in topo.machines])[:-1]]).astype(np.int64)
        self.machine_class = machine_class_of(topo)
        self.machine_class_members = [np.flatnonzero(self.machine_class == c) for c in range(int(self.machine_class.max()) + 1)]
        self.channel_latency = np.where(np.arange(len(bps)) < M, self.comm.intra_latency_s, self.comm.inter_latency_s)

    def _variable_facts(self, graph: OpGraph) -> None:
        var_index = {v.name: i for i, v in enumerate(graph.variables)}
        self.var_index = var_index
        self.num_vars = len(graph.variables)
        self.var_bytes = variable_bytes(graph)
        self.op_var = np.array([var_index.get(o.variable, -1) if o.variable else -1 for o in graph.ops], dtype=np.int64)
        has_var = np.flatnonzero(self.op_var >= 0)
        self.var_inc_var, self.var_inc_op = self.op_var[has_var], has_var
        self.param_reads = np.flatnonzero(np.array([o.is_parameter for o in graph.ops]) & (self.op_var >= 0))
        self.param_bytes = np.array([o.parameter_bytes for o in graph.ops], dtype=np.float64)
        self.apply_owner = _apply_owner(graph, var_index, self.op_var, self.is_apply, self.order)
        self.ps_class = _ps_classes(graph, var_index)
        # Gradient sync: trainable model variables whose gradient feeds the update.
        sync_vars, grad_ops, consumers = [], [], []
        e_sync_var = np.full(len(self.e_src), -1, dtype=np.int64)
        seen_grad: set[int] = set()
        for i, v in enumerate(graph.variables):
            if v.owner != "model" or not v.trainable or v.gradient_op not in graph.index:
                continue
            g = graph.index[v.gradient_op]
            if g in seen_grad:
                continue
            edges = np.flatnonzero((self.e_src == g) & self.is_apply[self.e_dst])
            if len(edges) == 0:
                continue
            seen_grad.add(g)
            e_sync_var[edges] = i
            sync_vars.append(i), grad_ops.append(g), consumers.append(self.e_dst[edges])
        self.e_sync_var = e_sync_var
        self.sync_vars = np.array(sync_vars, dtype=np.int64)
        self.sync_grad_op = np.array(grad_ops, dtype=np.int64)
        self.sync_bytes = self.var_bytes[self.sync_vars] if len(sync_vars) else np.zeros(0)
        self.sync_consumers = consumers
        self._sync_cons_flat = np.concatenate(consumers) if consumers else np.zeros(0, dtype=np.int64)
        self._sync_cons_owner = np.repeat(np.arange(len(consumers)), [len(c) for c in consumers])

    @cached_property
    def in_edges(self) -> list[np.ndarray]:
        """Edge indices into each op."""
        return _edges_by(self.e_dst, self.n)

    @cached_property
    def out_edges(self) -> list[np.ndarray]:
        return _edges_by(self.e_src, self.n)

    @cached_property
    def predecessors(self) -> list[list[int]]:
        return [self.e_src[e].tolist() for e in self.in_edges]

    @cached_property
    def successors(self) -> list[list[int]]:
        return [self.e_dst[e].tolist() for e in self.out_edges]

    @cached_property
    def data_dependent(self) -> np.ndarray:
        """Ops whose value depends on the batch (a replica's value is its own): batch-scaled ops and
        everything downstream of one. Variable reads and constants are the same on every replica."""
        dependent = self.batch_scaled.copy()
        for i in self.order.tolist():  # topological
            if not dependent[i] and any(dependent[j] for j in self.predecessors[i]):
                dependent[i] = True
        return dependent

    def sync_all_single(self, kind: np.ndarray) -> np.ndarray:
        """Per sync variable: are all consumers of its gradient single-device ops (a PS update)?"""
        from .units import SINGLE

        not_single = kind[self._sync_cons_flat] != SINGLE
        return np.bincount(self._sync_cons_owner[not_single], minlength=len(self.sync_vars)) == 0

    # ---- one evaluation --------------------------------------------------------

    def run(self, strategy: Strategy, timeline: bool = False) -> SimResult:
        s = strategy
        s.validate(self.n, self.topology.num_machines, self.num_devices)
        p = place(self, s)
        grad_colls, reduced = gradient_collectives(self, p, s)
        order, pos = execution_order(self, s)
        moves, edge_colls = edge_transfers(self, p, s, reduced, pos)
        transfers = concat_transfers([moves, variable_pulls(self, p, s)])  # uses `moves` up
        colls = concat_collectives([grad_colls, statistic_collectives(self, p, s), edge_colls])
        feed = plan_feed(self, s, p)
        sched = schedule(self, p, s, transfers, colls, order, pos, machines=not timeline,  # may use up `transfers`
                         rows_forwarded=feed is not None and bool(feed.forwarded))
        del transfers
        return self._result(s, feed, sched.transfers, colls, sched, timeline)

    def _result(self, s, feed, t, colls, sched: Schedule, want_timeline: bool) -> SimResult:
        slots = sched.slots
        S, T = len(slots.dev), sched.iteration
        busy = np.array([float(d.sum()) for d in sched.chains.per_slot(sched.chains.dur)])
        op_start, op_end, op_idle = op_times(self.n, sched, T)
        peak = slot_peaks(self, sched)
        G = s.num_groups
        makespan = group_makespans(s.op_groups, G, op_start, op_end)
        group_idle = np.bincount(s.op_groups, weights=op_idle, minlength=G)
        of = slots.of_dev
        peak_d = peak[of]
        device_oom = peak_d > self.capacity
        return SimResult(
            iteration_time_s=T + client_cost_s(self, feed, busy[of]),
            oom=bool(device_oom.any()),
            device_oom=device_oom,
            peak_memory_bytes=peak_d,
            memory_capacity_bytes=self.capacity.copy(),
            busy_s=busy[of],
            idle_s=np.maximum(T - busy[of], 0.0),  # a device busy all step: rounding would show -0
            op_start_s=op_start,
            op_end_s=op_end,
            op_idle_after_s=op_idle,
            group_makespan_s=makespan,
            group_idle_after_s=group_idle,
            comm_s=comm_totals(t, sched, colls),
            simulated_slots=S,
            timeline=self._timeline(t, colls, sched) if want_timeline else None,
        )

    def _timeline(self, t, colls, sched: Schedule) -> Timeline:
        slots = sched.slots
        cd, co, cs, ce = [], [], [], []
        ch = sched.chains
        per_slot = zip(ch.per_slot(ch.ops), ch.per_slot(sched.start), ch.per_slot(sched.end))
        for k, (ops, start, end) in enumerate(per_slot):
            for d in np.flatnonzero(slots.of_dev == k).tolist():
                cd.append(np.full(len(ops), d)), co.append(ops), cs.append(start), ce.append(end)
        md, mk, ms, me = [t.cons_dev], [t.kind], [sched.tr_start], [sched.tr_end]
        for c, devices in enumerate(colls.devices):
            n = len(devices)
            md.append(devices), mk.append(np.full(n, colls.kind[c]))
            ms.append(np.full(n, sched.coll_start[c])), me.append(np.full(n, sched.coll_end[c]))
        cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0)  # noqa: E731
        return Timeline(cat(cd).astype(np.int64), cat(co).astype(np.int64), cat(cs), cat(ce),
                        cat(md).astype(np.int64), cat(mk).astype(np.int64), cat(ms), cat(me))


def simulate(
    graph: OpGraph,
    topology: Topology,
    strategy: Strategy,
    profiles: pd.DataFrame | None = None,
    batch_size: int | None = None,
    timeline: bool = False,
) -> SimResult:
    """One-shot simulation; build a `Simulator` once instead when evaluating many strategies."""
    return Simulator(graph, topology, profiles, batch_size).run(strategy, timeline=timeline)


def _edges_by(endpoint: np.ndarray, n: int) -> list[np.ndarray]:
    order = np.argsort(endpoint, kind="stable")
    return np.split(order, np.searchsorted(endpoint[order], np.arange(1, n)))


def _priority_order(sim: Simulator, graph: OpGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Global execution order: as-soon-as-possible start under reference op times, inputs
    fetched just in time, and the optimizer update (with all that depends on it) last.

    Every device runs its ops in this order, so it must be topological: ASAP times grow
    along edges, ties fall back to Kahn's order.
    """
    n = sim.n
    topo = graph.topological_order()
    rank = np.empty(n, dtype=np.int64)
    rank[topo] = np.arange(n)
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for a, b in zip(sim.e_src.tolist(), sim.e_dst.tolist()):
        preds[b].append(a)
        succs[a].append(b)
    dur = sim.ref_time.tolist()
    asap = [0.0] * n
    for i in topo:
        if preds[i]:
            asap[i] = max(asap[j] + dur[j] for j in preds[i])
    key = list(asap)
    for i in range(n):
        if not preds[i] and succs[i]:
            key[i] = min(asap[j] for j in succs[i]) - dur[i]
    tail = np.zeros(n, dtype=bool)  # the update and everything after it
    for i in topo:
        if sim.is_apply[i] or any(tail[j] for j in preds[i]):
            tail[i] = True
    order = np.lexsort((rank, np.array(key), tail))
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    return order, pos, tail


def _apply_owner(graph: OpGraph, var_index: dict[str, int], op_var: np.ndarray, is_apply: np.ndarray,
                 order: np.ndarray) -> np.ndarray:
    """The model variable each optimizer op updates (-1 for shared ops such as the step counter).

    Ops naming a variable get it (an optimizer slot maps to the model variable its name
    embeds); unnamed ops take the one variable their consumers (else producers) agree on.
    """
    variables = graph.variables
    model = [(i, v.name.replace("/", "_")) for i, v in enumerate(variables) if v.owner == "model"]
    slot_owner = np.full(len(variables), -1, dtype=np.int64)
    for i, v in enumerate(variables):
        if v.owner == "model":
            slot_owner[i] = i
        else:
            matches = [(len(key), j) for j, key in model if key in v.name]
            slot_owner[i] = max(matches)[1] if matches else -1
    owner = np.full(len(op_var), -1, dtype=np.int64)
    named = (op_var >= 0) & is_apply
    owner[named] = slot_owner[op_var[named]]
    owner[~is_apply] = -1
    preds: dict[int, list[int]] = {}
    succs: dict[int, list[int]] = {}
    for e in graph.edges:
        if is_apply[e.src] and is_apply[e.dst]:
            succs.setdefault(e.src, []).append(e.dst)
            preds.setdefault(e.dst, []).append(e.src)
    apply_order = [int(i) for i in order if is_apply[i]]
    for sequence, links in ((reversed(apply_order), succs), (apply_order, preds)):
        for i in sequence:
            if owner[i] < 0:
                found = {int(owner[j]) for j in links.get(i, []) if owner[j] >= 0}
                if len(found) == 1:
                    owner[i] = found.pop()
    return owner


def _ps_classes(graph: OpGraph, var_index: dict[str, int]) -> np.ndarray:
    """Per variable, the class that must share one PS: variables an op takes together (an LSTM loop's
    kernels) are read on one device, so a PS group places them on the same one."""
    sets = DisjointSets(len(graph.variables))
    for op in graph.ops:
        if op.other_variables and op.variable in var_index:
            for name in op.other_variables:
                if name in var_index:
                    sets.union(var_index[name], var_index[op.variable])
    return sets.roots()
