"""Compile the simulator's numba kernels into their on-disk cache (`make install` runs this), so that the
first `tag plan` after an install spends its budget searching rather than compiling. A plan of a small
hand-built training graph on four machines of two GPU types (two alike of each, so that alike machines
collapse) runs every kernel with the argument types a real plan gives them."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from tag_core.capture.graph import Edge, Op, OpGraph, Variable
from tag_core.cluster import Machine, Topology, lookup_gpu

BATCH, WIDTH, LAYERS = 8, 64, 3


def _graph() -> OpGraph:
    """input -> LAYERS matmuls -> loss, their gradients and updates."""
    activation, weight = 4 * BATCH * WIDTH, 4 * WIDTH * WIDTH
    flops = 2 * BATCH * WIDTH * WIDTH
    ops = [Op("x", "Placeholder", activation, 0, is_input=True, batch_scaled=True)]
    edges, variables, previous = [], [], 0
    for i in range(LAYERS):
        ops += [Op(f"read{i}", "ReadVariableOp", weight, 0, weight, is_parameter=True, variable=f"w{i}"),
                Op(f"mm{i}", "MatMul", activation, flops, batch_scaled=True)]
        edges += [Edge(previous, len(ops) - 1, activation, True, f"x{i}:0"),
                  Edge(len(ops) - 2, len(ops) - 1, weight, False, f"read{i}:0")]
        previous = len(ops) - 1
    ops.append(Op("loss", "Mean", 4, BATCH * WIDTH))
    edges.append(Edge(previous, len(ops) - 1, activation, True, "mm:0"))
    upstream = len(ops) - 1
    for i in reversed(range(LAYERS)):
        d = len(ops)
        ops += [Op(f"dmm{i}", "MatMul", activation, flops, is_gradient=True, batch_scaled=True),
                Op(f"gw{i}", "MatMul", weight, flops, is_gradient=True),
                Op(f"apply{i}", "AssignSubVariableOp", 0, weight // 4, is_apply=True, variable=f"w{i}")]
        edges += [Edge(upstream, d, activation, upstream != LAYERS * 2 + 1, f"up{i}:0"),
                  Edge(d, d + 1, activation, True, f"dmm{i}:0"), Edge(d + 1, d + 2, weight, False, f"gw{i}:0")]
        variables.append(Variable(f"w{i}", (WIDTH, WIDTH), "float32", weight, True, "model", f"gw{i}"))
        upstream = d
    edges.sort(key=lambda e: (e.src, e.dst, e.tensor))
    return OpGraph("warm", BATCH, ops, edges, variables)


def _profiles(graph: OpGraph) -> pd.DataFrame:
    rows = [(graph.model, op.name, "V100-32GB", batch, run, (20.0 * batch if op.batch_scaled else 5.0) * jitter)
            for batch in (2, 4, 8) for op in graph.ops for run, jitter in enumerate((1.0, 0.9, 1.2))]
    return pd.DataFrame(rows, columns=["model", "op", "device_type", "batch_size", "run", "time_us"])


def warm_kernels() -> float:
    """Plan and simulate the small graph; the seconds it took (most of it compiling, the first time)."""
    from tag_core.plan.planner import plan
    from tag_core.search.mcts import Budget
    from tag_core.simulate import Simulator, Strategy

    started = time.perf_counter()
    graph = _graph()
    profiles = _profiles(graph)
    machines = tuple(Machine(f"{gpu}-{i}", lookup_gpu(gpu), 2, gbps) for gpu, gbps in (("V100-32GB", 150.0),
                                                                                       ("T4", 32.0)) for i in range(2))
    topology = Topology("warm", machines, inter_gbps=10.0)
    simulator = Simulator(graph, topology, profiles)
    shares = np.array([2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0])
    for option in ("allreduce", "ps", "duplicate", "model_parallel"):
        simulator.run(Strategy.uniform(len(graph.ops), len(machines), 8, option, batch_shares=shares))
    plan(graph, topology, profiles, budget=Budget(iterations=4), seed=0)
    return time.perf_counter() - started


if __name__ == "__main__":
    print(f"simulator kernels compiled and cached ({warm_kernels():.1f} s)")
