"""METIS op groups: the units MCTS places and replicates.

Vertices are ops weighted by compute time; edges are tensors weighted by
bytes, so cuts fall on thin tensors and groups carry similar work. Ops that
touch the same variable (its read and its update, or a loop over several
variables) are contracted into one vertex first: a variable must live with
the ops that use it. So are a loop and its gradient loop, and the two ends of
a tensor of unknown size (a TensorList): the emitter can neither split nor
combine those across placements.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from tag_core.capture.graph import OpGraph
from tag_core.disjoint_sets import DisjointSets
from tag_core.errors import TagInputError

DEFAULT_GROUPS = 60
# METIS imbalance in 1/1000ths over perfect balance. With recursive bisection this leaves few parts
# empty on skewed graphs; larger values make METIS fail to bisect tiny remainders.
DEFAULT_UFACTOR = 100


@dataclass(frozen=True)
class OpGroups:
    assignment: np.ndarray  # op index -> group index; group 0 has the most compute
    group_time_us: np.ndarray  # compute time per group on the reference device
    seed: int

    @property
    def num_groups(self) -> int:
        return len(self.group_time_us)

    def members(self, group: int) -> np.ndarray:
        return np.flatnonzero(self.assignment == group)

    def content_hash(self) -> str:
        digest = hashlib.sha256(self.assignment.astype(np.int32).tobytes())
        return digest.hexdigest()[:16]

    def to_json(self) -> dict:
        return {"assignment": self.assignment.tolist(), "group_time_us": self.group_time_us.tolist(), "seed": self.seed}

    @classmethod
    def from_json(cls, data: dict) -> "OpGroups":
        return cls(np.asarray(data["assignment"], dtype=np.int64), np.asarray(data["group_time_us"], dtype=float), int(data["seed"]))


LOOP_TYPES = ("While", "StatelessWhile")


def _contract(graph: OpGraph) -> np.ndarray:
    """Op -> vertex, merging ops that touch the same variable or share a tensor no placement may cut."""
    sets = DisjointSets(len(graph.ops))
    first_by_variable: dict[str, int] = {}
    for i, op in enumerate(graph.ops):
        for variable in filter(None, (op.variable, *op.other_variables)):
            sets.union(i, first_by_variable.setdefault(variable, i))
    # Tensors the emitter cannot split over replicas or combine from them stay inside one group: those
    # whose size capture could not see (TensorLists, handles) and whatever a loop hands its gradient loop.
    for e in graph.edges:
        loops = graph.ops[e.src].type in LOOP_TYPES and graph.ops[e.dst].type in LOOP_TYPES
        if e.tensor and (e.bytes == 0 or loops):
            sets.union(e.src, e.dst)
    roots = sets.roots()
    _, vertex = np.unique(roots, return_inverse=True)
    return vertex


def group_ops(graph: OpGraph, op_time_us: np.ndarray, num_groups: int = DEFAULT_GROUPS, seed: int = 0) -> OpGroups:
    """Partition `graph` into at most `num_groups` groups, ordered by compute time, largest first."""
    import pymetis

    if not isinstance(num_groups, int) or num_groups <= 0:
        raise TagInputError("groups", f"must be a positive integer, got {num_groups!r}")
    op_time_us = np.asarray(op_time_us, dtype=float)
    if op_time_us.shape != (len(graph.ops),):
        raise ValueError(f"op_time_us has {op_time_us.shape}, expected ({len(graph.ops)},)")
    vertex = _contract(graph)
    vertices = int(vertex.max()) + 1 if len(vertex) else 0
    vertex_time = np.bincount(vertex, weights=op_time_us, minlength=vertices)

    if vertices <= num_groups:
        raw = np.arange(vertices)
    else:
        raw = _metis(graph, vertex, vertices, vertex_time, num_groups, seed, pymetis)

    # Relabel: drop empty parts, order by compute time (largest first), ties by first op.
    op_part = raw[vertex]
    parts = np.unique(op_part)
    time_by_part = np.array([op_time_us[op_part == p].sum() for p in parts])
    first_op = np.array([np.flatnonzero(op_part == p)[0] for p in parts])
    order = np.lexsort((first_op, -time_by_part))
    relabel = np.empty(int(parts.max()) + 1, dtype=np.int64)
    relabel[parts[order]] = np.arange(len(parts))
    assignment = relabel[op_part]
    return OpGroups(assignment=assignment, group_time_us=time_by_part[order], seed=seed)


def _metis(graph, vertex, vertices, vertex_time, num_groups, seed, pymetis) -> np.ndarray:
    # Undirected, merged adjacency between contracted vertices; weights are bytes in KiB (METIS wants ints).
    src = vertex[[e.src for e in graph.edges]] if graph.edges else np.array([], dtype=np.int64)
    dst = vertex[[e.dst for e in graph.edges]] if graph.edges else np.array([], dtype=np.int64)
    weight = np.array([e.bytes for e in graph.edges], dtype=np.float64)
    keep = src != dst
    src, dst, weight = src[keep], dst[keep], weight[keep]
    a = np.concatenate([src, dst])
    b = np.concatenate([dst, src])
    w = np.concatenate([weight, weight])
    key = a * vertices + b
    unique, inverse = np.unique(key, return_inverse=True)
    merged = np.bincount(inverse, weights=w)
    rows, cols = unique // vertices, unique % vertices
    starts = np.zeros(vertices + 1, dtype=np.int64)
    np.add.at(starts, rows + 1, 1)
    starts = np.cumsum(starts)
    eweights = np.maximum(1, np.ceil(merged / 1024)).astype(np.int64)
    # sqrt softens the skew between a few huge ops and many tiny ones (as the TAG authors do);
    # with raw times METIS leaves many parts empty. Scaled to integers with enough resolution.
    softened = np.sqrt(np.maximum(vertex_time, 0.0))
    scale = 1000.0 / max(softened.max(), 1e-9)
    vweights = np.maximum(1, np.round(softened * scale)).astype(np.int64)
    options = pymetis.Options(seed=seed, ufactor=DEFAULT_UFACTOR)
    adjacency = pymetis.CSRAdjacency(starts.tolist(), cols.tolist())
    with _quiet_metis():
        _, parts = pymetis.part_graph(
            num_groups, adjacency=adjacency, vweights=vweights.tolist(), eweights=eweights.tolist(), options=options,
            recursive=True,
        )
    return np.asarray(parts, dtype=np.int64)


@contextmanager
def _quiet_metis():
    """METIS printf()s notes such as "too many parts" (it then leaves parts empty, which group_ops
    drops) to stdout, where `tag plan --json` writes JSON: send them to /dev/null. Errors still raise."""
    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        yield
    finally:
        ctypes.CDLL(None).fflush(None)  # C stdio buffers a pipe: flush before fd 1 points back at stdout
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)
