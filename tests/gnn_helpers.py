"""Small search problems for the GNN tests: the hand-built graph of simgraphs on a few machines."""

from __future__ import annotations

from dataclasses import replace

from simgraphs import topology, train_graph

from tag_core.cluster import GpuType
from tag_core.gnn.problems import ModelSource, build_problem

# Slow made-up GPUs so op times sit far above the 4 µs kernel-launch floor (roofline times, no profiles).
SLOW_A = GpuType("slow-a", tflops=0.002, mem_gb=16.0, mem_bw_gbps=2.0)
SLOW_B = GpuType("slow-b", tflops=0.001, mem_gb=8.0, mem_bw_gbps=1.0)
SLOW_C = GpuType("slow-c", tflops=0.0005, mem_gb=8.0, mem_bw_gbps=0.5)


def source(layers: int = 6, groups: int = 6) -> ModelSource:
    return ModelSource.build("hand", train_graph(layers=layers), None, groups)


def machines(scale: float = 1.0, order: tuple[int, ...] = (0, 1, 2)):
    """Three machines of distinct speed; `scale` multiplies every GPU speed and every link."""
    fast = lambda g: replace(g, tflops=g.tflops * scale, mem_bw_gbps=g.mem_bw_gbps * scale)  # noqa: E731
    spec = [("a", fast(SLOW_A), 2, 8.0 * scale), ("b", fast(SLOW_B), 2, 4.0 * scale), ("c", fast(SLOW_C), 1, 4.0 * scale)]
    return topology(*[spec[i] for i in order], inter_gbps=1.0 * scale)


def problem(scale: float = 1.0, order: tuple[int, ...] = (0, 1, 2), settings: str = "dp", layers: int = 6, groups: int = 6):
    return build_problem(source(layers, groups), machines(scale, order), settings)
