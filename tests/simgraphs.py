"""Small hand-built OpGraphs, topologies and profiles with known costs, for simulator tests."""

from __future__ import annotations

import pandas as pd

from tag_core.capture import Edge, Op, OpGraph, Variable
from tag_core.cluster import GpuType, Machine, Topology, lookup_gpu

BATCH = 8
W_BYTES = 4_000_000
PROFILE_COLUMNS = ["model", "op", "device_type", "batch_size", "run", "time_us"]


def train_graph(weight_bytes: int = W_BYTES, layers: int = 1) -> OpGraph:
    """x -> (matmul with w_i)^layers -> loss -> backward -> gradient of each w_i -> apply.

    Ops per layer i: read_i (parameter), mm_i (forward), dmm_i (backward, batch), gw_i
    (gradient of w_i), apply_i (update). Then one input, one loss.
    """
    ops = [Op("x", "Placeholder", 4 * BATCH * 256, 0, is_input=True, batch_scaled=True)]
    edges: list[Edge] = []
    variables: list[Variable] = []
    prev = 0
    for i in range(layers):
        r = len(ops)
        ops.append(Op(f"read{i}", "ReadVariableOp", weight_bytes, 0, weight_bytes, is_parameter=True, variable=f"w{i}"))
        ops.append(Op(f"mm{i}", "MatMul", 4 * BATCH * 256, 2 * BATCH * 256 * 256, batch_scaled=True))
        edges += [Edge(prev, r + 1, 4 * BATCH * 256, True, f"x{i}:0"), Edge(r, r + 1, weight_bytes, False, f"read{i}:0")]
        prev = r + 1
    loss = len(ops)
    ops.append(Op("loss", "Mean", 4, BATCH * 256, batch_scaled=False))
    edges.append(Edge(prev, loss, 4 * BATCH * 256, True, "mm:0"))
    upstream = loss
    for i in reversed(range(layers)):
        d = len(ops)
        ops.append(Op(f"dmm{i}", "MatMul", 4 * BATCH * 256, 2 * BATCH * 256 * 256, is_gradient=True, batch_scaled=True))
        ops.append(Op(f"gw{i}", "MatMul", weight_bytes, 2 * BATCH * 256 * 256, is_gradient=True))
        ops.append(Op(f"apply{i}", "AssignSubVariableOp", 0, weight_bytes // 4, is_apply=True, variable=f"w{i}"))
        edges += [
            Edge(upstream, d, 4 * BATCH * 256, upstream != loss, f"up{i}:0"),
            Edge(d, d + 1, 4 * BATCH * 256, True, f"dmm{i}:0"),
            Edge(d + 1, d + 2, weight_bytes, False, f"gw{i}:0"),
        ]
        variables.append(Variable(f"w{i}", (weight_bytes // 4,), "float32", weight_bytes, True, "model", f"gw{i}"))
        upstream = d
    edges.sort(key=lambda e: (e.src, e.dst, e.tensor))
    return OpGraph("hand", BATCH, ops, edges, variables)


def profiles(graph: OpGraph, device_type: str, per_sample_us: float = 10.0, constant_us: float = 5.0,
             batches=(4, 8)) -> pd.DataFrame:
    """Batch-scaled ops take per_sample_us * batch, the rest constant_us; three runs each (median = middle)."""
    rows = []
    for b in batches:
        for op in graph.ops:
            base = per_sample_us * b if op.batch_scaled else constant_us
            for run, jitter in enumerate((1.0, 0.9, 1.3)):
                rows.append((graph.model, op.name, device_type, b, run, base * jitter))
    return pd.DataFrame(rows, columns=PROFILE_COLUMNS)


def fixed_profiles(graph: OpGraph, device_type: str, times_us: dict[str, float], batches=(4, 8)) -> pd.DataFrame:
    """Each op takes times_us[its name] at every batch size, one run: a step whose ops' times a test chooses."""
    rows = [(graph.model, op, device_type, b, 0, us) for op, us in times_us.items() for b in batches]
    return pd.DataFrame(rows, columns=PROFILE_COLUMNS)


def topology(*machines: tuple[str, str | GpuType, int, float], inter_gbps: float = 10.0, links=()) -> Topology:
    built = tuple(
        Machine(name, lookup_gpu(gpu) if isinstance(gpu, str) else gpu, count, intra) for name, gpu, count, intra in machines
    )
    return Topology("test", built, inter_gbps, tuple(links))


def calibration(topo: Topology, collectives=None, per_step_s: float = 0.0, samples=()):
    """A calibration of `topo` with fixed link fits (inter: 0.9 ms + 7.8 Gbit/s; intra: 20 us + 80 Gbit/s)."""
    from tag_core.cluster.calibration import Calibration, Fit, Overheads

    def fit(latency_s, gbps):
        return Fit(latency_s=latency_s, gbps=gbps, residual_rms_s=0.0, residual_max_rel=0.0, samples=6)

    return Calibration(topology=topo.name, topology_hash=topo.content_hash(), source="local", host="here",
                       code_version="test", links={"inter": fit(9e-4, 7.8), "intra": fit(2e-5, 80.0)},
                       collectives={kind: {link: {n: fit(*terms) for n, terms in sizes.items()}
                                           for link, sizes in by_link.items()}
                                    for kind, by_link in (collectives or {}).items()},
                       overheads=Overheads(per_op_s=1e-5, per_step_s=per_step_s, per_transfer_s=1e-3),
                       samples=tuple(samples))
