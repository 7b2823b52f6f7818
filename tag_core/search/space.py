"""The strategy space the planners search, and scoring strategies with the simulator.

An action is (placement mask over machines, option); a plan is one action per op group.
`ActionSpace` lists the masks (see mcts.py for which and why: one bit per machine up to 16
machines, "k machines of class c" beyond; on racks, also each rack's and each pod's machines,
so that gradient sync can stay under an oversubscribed uplink), `Evaluator` turns action vectors into Strategies
and simulates each distinct one once (its cache is keyed by the class-level action vector).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np

from tag_core.capture.graph import Edge, OpGraph
from tag_core.cluster.classes import class_mask, machine_classes
from tag_core.simulate.memory import group_makespans
from tag_core.simulate.result import SimResult
from tag_core.simulate.simulator import Simulator
from tag_core.simulate.stopwatch import Stopwatch
from tag_core.simulate.strategy import OPTIONS, Strategy

from .grouping import OpGroups, group_ops

OPS_PER_PART = 4  # model parallelism: fewest ops per device part
MAX_SINGLES = 8  # single-machine masks beyond this many machines only for the fastest
PER_MACHINE_UP_TO = 16  # up to this many machines a mask bit per machine; beyond, masks over machine classes
ALLREDUCE, MODEL_PARALLEL = OPTIONS.index("allreduce"), OPTIONS.index("model_parallel")


# ---- action space ------------------------------------------------------------


@dataclass
class ActionSpace:
    """Action a = mask index * len(OPTIONS) + option index."""

    masks: np.ndarray  # bool (K, machines)
    mask_names: list[str]

    @property
    def size(self) -> int:
        return len(self.masks) * len(OPTIONS)

    def mask(self, action: int) -> np.ndarray:
        return self.masks[action // len(OPTIONS)]

    def option(self, action: int) -> str:
        return OPTIONS[action % len(OPTIONS)]

    def describe(self, action: int) -> str:
        return f"{self.mask_names[action // len(OPTIONS)]}/{self.option(action)}"

    def index(self, mask: np.ndarray, option: str, name: str = "") -> int:
        """The action of (mask, option); an unseen mask is appended (warm starts bring their own)."""
        mask = np.asarray(mask, dtype=bool)
        hits = np.flatnonzero((self.masks == mask[None, :]).all(axis=1))
        if len(hits):
            k = int(hits[0])
        else:
            self.masks = np.vstack([self.masks, mask[None, :]])
            self.mask_names.append(name or "+".join(str(i) for i in np.flatnonzero(mask)))
            k = len(self.masks) - 1
        return k * len(OPTIONS) + OPTIONS.index(option)

    @property
    def all_machines(self) -> int:
        return self.index(np.ones(self.masks.shape[1], dtype=bool), "allreduce")

    @classmethod
    def build(cls, sim: Simulator, device_speed: np.ndarray) -> "ActionSpace":
        topo = sim.topology
        M = topo.num_machines
        machine_speed = np.bincount(sim.dev_machine, weights=device_speed, minlength=M)
        if M > PER_MACHINE_UP_TO:
            return cls.by_class(sim, machine_speed)
        fastest = np.argsort(-machine_speed, kind="stable")
        candidates: list[tuple[str, np.ndarray]] = [("all", np.ones(M, dtype=bool))]
        for m in sorted(fastest[:MAX_SINGLES].tolist()):
            candidates.append((topo.machines[m].name, np.arange(M) == m))
        candidates += _type_masks(topo)
        candidates += _unit_masks(topo, machine_speed)
        ks = range(2, M) if M <= 10 else sorted({int(round(M ** (i / 6))) for i in range(1, 6)} - {0, 1, M})
        for k in ks:
            mask = np.zeros(M, dtype=bool)
            mask[fastest[:k]] = True
            candidates.append((f"top{k}", mask))
        return cls._distinct(candidates)

    @classmethod
    def by_class(cls, sim: Simulator, machine_speed: np.ndarray) -> "ActionSpace":
        """Masks over machine classes (tag_core/cluster/classes.py), so their number grows with the kinds of
        machine, not the machines: k machines of a class for a few k per class (the fastest classes), the
        fastest classes whole, and the k fastest machines (classes in speed order, each packed by rack)."""
        topo = sim.topology
        M = topo.num_machines
        classes = machine_classes(topo)
        speed = [float(machine_speed[c.machines[0]]) for c in classes]
        by_speed = sorted(range(len(classes)), key=lambda c: -speed[c])  # stable: ties keep class order
        candidates: list[tuple[str, np.ndarray]] = [("all", np.ones(M, dtype=bool))]
        for c in by_speed[:MAX_SINGLES]:
            n = classes[c].size
            for k in sorted({max(1, int(round(n ** (i / 3)))) for i in range(4)}):
                name = f"{k}x{classes[c].count}x{classes[c].gpu}" + (f"#{c}" if len(classes) > 1 else "")
                candidates.append((name, class_mask(topo, {c: k}, classes)))
        candidates += _type_masks(topo)
        candidates += _unit_masks(topo, machine_speed)
        for j in range(2, min(len(classes), MAX_SINGLES + 1)):
            candidates.append((f"top{j}classes", class_mask(topo, {c: classes[c].size for c in by_speed[:j]}, classes)))
        order = [m for c in by_speed for m in classes[c].machines]
        for k in sorted({int(round(M ** (i / 6))) for i in range(1, 6)} - {0, 1, M}):
            mask = np.zeros(M, dtype=bool)
            mask[order[:k]] = True
            candidates.append((f"top{k}", mask))
        return cls._distinct(candidates)

    @classmethod
    def _distinct(cls, candidates: list[tuple[str, np.ndarray]]) -> "ActionSpace":
        masks, names, seen = [], [], set()
        for name, mask in candidates:
            key = mask.tobytes()
            if mask.any() and key not in seen:
                seen.add(key)
                masks.append(mask)
                names.append(name)
        return cls(np.array(masks, dtype=bool), names)


def _type_masks(topo) -> list[tuple[str, np.ndarray]]:
    types = [m.gpu.name for m in topo.machines]
    return [(f"all-{t}", np.array([x == t for x in types])) for t in dict.fromkeys(types)]


def _unit_masks(topo, machine_speed: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """On racks: the machines of each rack, and of each pod when there are pods (the MAX_SINGLES fastest
    units of each level). Gradient sync kept under an oversubscribed uplink needs a mask inside one unit,
    and the k-fastest masks give one only when the machine order follows the racks."""
    h = topo.hierarchy
    if not h.hierarchical:
        return []
    out: list[tuple[str, np.ndarray]] = []
    for level, unit_of, names in (("rack", h.machine_rack, h.rack_names), ("pod", h.machine_pod, h.pod_names)):
        n = int(unit_of.max()) + 1
        if n < 2:
            continue
        speed = np.bincount(unit_of, weights=machine_speed, minlength=n)
        for u in sorted(np.argsort(-speed, kind="stable")[:MAX_SINGLES].tolist()):
            out.append((f"{level}:{names[u]}", unit_of == u))
    return out


# ---- scoring -------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    time_s: float
    oom: bool


class Evaluator:
    """Turns action vectors into Strategies and simulates them, once per distinct vector.

    `shares`, `fusion_bytes` and `overlap` are strategy-wide settings the planner fixes
    before the search. The last few full SimResults are kept for prior hooks.
    """

    def __init__(self, sim: Simulator, groups: OpGroups, space: ActionSpace, shares: np.ndarray,
                 fusion_bytes: int = 0, overlap: bool = True, speed: np.ndarray | None = None,
                 keep_results: int = 16):
        self.sim, self.groups, self.space = sim, groups, space
        self.shares, self.fusion_bytes, self.overlap = np.asarray(shares, dtype=float), int(fusion_bytes), overlap
        self.speed = self.shares if speed is None else np.asarray(speed, dtype=float)
        self._splits: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._parts: dict[tuple[int, int], np.ndarray] = {}  # (group, parts) -> part of each of its ops
        self._edges_by_group: dict[int, np.ndarray] | None = None
        self.cache: dict[bytes, Score] = {}
        self.simulations = 0
        self.slowest_s = 0.0  # the slowest simulation so far: what one more may overrun a seconds budget by
        self._recent: OrderedDict[bytes, SimResult] = OrderedDict()
        self._keep = keep_results

    def strategy(self, actions: np.ndarray, name: str = "tag") -> Strategy:
        actions = np.asarray(actions, dtype=np.int64)
        k = len(OPTIONS)
        op_devices = None
        mp = np.flatnonzero(actions % k == MODEL_PARALLEL)
        if len(mp):
            op_devices = np.full(len(self.groups.assignment), -1, dtype=np.int64)
            for g in mp.tolist():
                ops, devs = self._split(g, int(actions[g] // k))
                op_devices[ops] = devs
        # Op groups that share an action become one strategy group: the same plan, but gradient
        # fusion buckets (which the simulator closes at group boundaries) may then span them.
        distinct, merged = np.unique(actions, return_inverse=True)
        return Strategy(merged[self.groups.assignment], self.space.masks[distinct // k],
                        [OPTIONS[a % k] for a in distinct.tolist()], self.shares, fusion_bytes=self.fusion_bytes,
                        overlap=self.overlap, op_devices=op_devices, name=name)

    def _split(self, group: int, mask: int) -> tuple[np.ndarray, np.ndarray]:
        """Model parallelism: METIS splits the group's ops over the mask's devices, one part per
        device (at most one per OPS_PER_PART ops), the largest part on the fastest device;
        ops touching one variable stay together."""
        key = (group, mask)
        hit = self._splits.get(key)
        if hit is None:
            ops = self.groups.members(group)
            devs = np.flatnonzero(self.space.masks[mask][self.sim.dev_machine] & (self.shares > 0))
            devs = devs[np.argsort(-self.speed[devs], kind="stable")]
            if self._edges_by_group is None:
                src_group = self.groups.assignment[self.sim.e_src]
                inside = np.flatnonzero(src_group == self.groups.assignment[self.sim.e_dst])
                self._edges_by_group = {int(x): inside[src_group[inside] == x] for x in np.unique(src_group[inside])}
            edges = self._edges_by_group.get(group, np.zeros(0, dtype=np.int64))
            # At most one part per OPS_PER_PART ops: METIS cannot bisect tiny remainders (and says so on stdout).
            n_parts = max(1, min(len(devs), len(ops) // OPS_PER_PART))
            # The parts depend on the part count only: masks of many machines share one METIS run.
            parts = self._parts.get((group, n_parts))
            if parts is None:
                parts = self._parts[group, n_parts] = group_ops(
                    subgraph(self.sim.graph, ops, edges), self.sim.ref_time[ops] * 1e6, n_parts, seed=0).assignment
            hit = self._splits[key] = (ops, devs[parts])
        return hit

    def score(self, actions: np.ndarray) -> Score:
        key = np.asarray(actions, dtype=np.int64).tobytes()
        hit = self.cache.get(key)
        if hit is None:
            result = self._run(actions)
            self.simulations += 1
            hit = self.cache[key] = Score(float(result.iteration_time_s), bool(result.oom))
            self._remember(key, result)
        return hit

    def best_uniform(self) -> np.ndarray | None:
        """The fastest plan scored so far with one action for every group (None if none was)."""
        best = None
        for key, score in self.cache.items():
            actions = np.frombuffer(key, dtype=np.int64)
            if (actions == actions[0]).all() and (best is None or (score.oom, score.time_s) < best[0]):
                best = ((score.oom, score.time_s), actions)
        return None if best is None else best[1].copy()

    def result(self, actions: np.ndarray) -> SimResult:
        """The full SimResult of an action vector (simulated again if no longer kept), with
        `group_makespan_s` and `group_idle_after_s` per op group."""
        key = np.asarray(actions, dtype=np.int64).tobytes()
        result = self._recent.get(key)
        if result is None:
            result = self._run(actions)
            if key not in self.cache:
                self.simulations += 1
                self.cache[key] = Score(float(result.iteration_time_s), bool(result.oom))
            self._remember(key, result)
            result = self._recent[key]
        return result

    def _run(self, actions: np.ndarray) -> SimResult:
        watch = Stopwatch()  # a first run's compiling is no simulation's cost
        result = self.sim.run(self.strategy(actions))
        self.slowest_s = max(self.slowest_s, watch.seconds())
        return result

    def _per_op_group(self, result: SimResult) -> SimResult:
        """The result with per-group figures for the planner's op groups (the strategy merges
        groups that share an action; a prior hook wants one row per op group)."""
        g, G = self.groups.assignment, self.groups.num_groups
        makespan = group_makespans(g, G, result.op_start_s, result.op_end_s)
        idle = np.bincount(g, weights=result.op_idle_after_s, minlength=G)
        return replace(result, group_makespan_s=makespan, group_idle_after_s=idle)

    def _remember(self, key: bytes, result: SimResult) -> None:
        self._recent[key] = self._per_op_group(result)
        if len(self._recent) > self._keep:
            self._recent.popitem(last=False)


def subgraph(graph: OpGraph, ops: np.ndarray, edges: np.ndarray) -> OpGraph:
    """The ops `ops` (sorted indices) and `edges` (indices of edges among them), renumbered."""
    local = {int(i): k for k, i in enumerate(ops.tolist())}
    kept = [graph.edges[i] for i in edges.tolist()]
    return OpGraph(graph.model, graph.batch_size, [graph.ops[i] for i in ops.tolist()],
                   [Edge(local[e.src], local[e.dst], e.bytes, e.batch, e.tensor) for e in kept], [])


def reward(score: Score, baseline_s: float) -> float:
    return -1.0 if score.oom else baseline_s / max(score.time_s, 1e-12) - 1.0
