"""Compute costs with a fusion plan applied: each fused pattern runs as one kernel.

A pattern costs one launch plus max(flops / peak, bytes crossing its boundary /
memory bandwidth) on the device, instead of the sum of its ops. The whole cost
sits on the pattern's last op (in the schedule's topological order) and its
other ops cost nothing, so the simulator, the planner and the GNN all see the
fused costs without knowing about patterns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tag_core.capture.graph import OpGraph
from tag_core.cluster.gpu_catalog import GpuType
from tag_core.simulate.cost import ComputeModel, launch_floor

from .patterns import FusionPlan


class FusedComputeModel(ComputeModel):
    def __init__(self, graph: OpGraph, profiles: pd.DataFrame | None, plan: FusionPlan):
        super().__init__(graph, profiles)
        order = graph.topological_order()
        position = np.empty(len(graph.ops), dtype=np.int64)
        position[order] = np.arange(len(graph.ops))
        self.patterns: list[np.ndarray] = []
        self.pattern_bytes, self.pattern_batch_bytes = [], []
        src = np.array([e.src for e in graph.edges], dtype=np.int64)
        dst = np.array([e.dst for e in graph.edges], dtype=np.int64)
        nbytes = np.array([e.bytes for e in graph.edges], dtype=np.float64)
        batch = np.array([e.batch for e in graph.edges], dtype=bool)
        for names in plan.patterns:
            members = np.array(sorted((graph.index[n] for n in names if n in graph.index), key=lambda i: position[i]))
            if len(members) < 2:
                continue
            inside = np.zeros(len(graph.ops), dtype=bool)
            inside[members] = True
            crossing = inside[src] != inside[dst]  # tensors read from or written to memory
            self.patterns.append(members)
            self.pattern_bytes.append(float(nbytes[crossing & ~batch].sum()))
            self.pattern_batch_bytes.append(float(nbytes[crossing & batch].sum()))
        self.fused_ops = int(sum(len(m) for m in self.patterns))

    def times(self, gpu: GpuType, batch: float) -> np.ndarray:
        key = ("fused", gpu.name.lower(), round(float(batch), 6))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        result = super().times(gpu, batch).copy()
        scale = np.where(self.batch_scaled, batch / self.graph_batch, 1.0)
        flops = self.flops * scale
        for members, fixed_bytes, batch_bytes in zip(self.patterns, self.pattern_bytes, self.pattern_batch_bytes):
            boundary = fixed_bytes + batch_bytes * batch / self.graph_batch
            fused = launch_floor(gpu) + max(flops[members].sum() / gpu.flops_per_s, boundary / gpu.mem_bw_bytes_per_s)
            result[members] = 0.0
            result[members[-1]] = fused
        result.flags.writeable = False
        self._cache[key] = result
        return result
