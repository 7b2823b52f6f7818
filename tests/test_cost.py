"""Cost model: profile interpolation, roofline transfer between device types, communication formulas."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from simgraphs import profiles, train_graph

from tag_core.cluster import CATALOG, lookup_gpu
from tag_core.simulate import ComputeModel
from tag_core.simulate.cost import (
    GPU_LAUNCH_FLOOR_S,
    LATENCY_S,
    allgather_time,
    broadcast_time,
    bytes_per_s,
    hierarchical_allreduce_time,
    ps_time,
    ring_allreduce_time,
    transfer_time,
)

V100 = lookup_gpu("V100-32GB")
T4 = lookup_gpu("T4")


def _rows(graph, device_type, table):
    """table: {batch: {op name: [times in us]}}"""
    return pd.DataFrame(
        [(graph.model, op, device_type, b, run, t) for b, ops in table.items() for op, ts in ops.items()
         for run, t in enumerate(ts)],
        columns=["model", "op", "device_type", "batch_size", "run", "time_us"],
    )


def test_profile_medians_interpolate_and_extrapolate_over_batch():
    g = train_graph()
    model = ComputeModel(g, _rows(g, "V100-32GB", {
        4: {"mm0": [40, 41, 900], "loss": [7, 5, 6]},  # an outlier run: the median ignores it
        8: {"mm0": [80, 79, 81], "loss": [6, 6, 6]},
    }))
    mm, loss = g.index["mm0"], g.index["loss"]
    at = lambda b: model.times(V100, b)  # noqa: E731
    assert at(4)[mm] == pytest.approx(41e-6)
    assert at(8)[mm] == pytest.approx(80e-6)
    assert at(6)[mm] == pytest.approx((41e-6 + 80e-6) / 2)
    assert at(16)[mm] == pytest.approx(80e-6 + (80e-6 - 41e-6) * 2)  # linear beyond the last point
    assert at(2)[mm] == pytest.approx(41e-6 - 2 * (80e-6 - 41e-6) / 4)  # linear below the first
    assert at(0.1)[mm] == pytest.approx(GPU_LAUNCH_FLOOR_S)  # clamped at the launch floor
    # The loss reads a batch tensor, so it scales too; an op with no batch anywhere would not.
    assert at(6)[loss] == pytest.approx(6e-6)
    read = g.index["read0"]  # not profiled: roofline of a 4 MB copy plus the launch floor
    assert at(8)[read] == pytest.approx(max(0, 4_000_000 / V100.mem_bw_bytes_per_s) + GPU_LAUNCH_FLOOR_S)


def test_batch_free_ops_take_their_median_over_batches():
    g = train_graph()
    apply = g.index["apply0"]
    model = ComputeModel(g, _rows(g, "T4", {2: {"apply0": [10, 10, 10]}, 8: {"apply0": [12, 12, 12]},
                                           16: {"apply0": [30, 30, 30]}}))
    for b in (1, 5, 64):
        assert model.times(T4, b)[apply] == pytest.approx(12e-6)


def test_unprofiled_type_uses_the_roofline_ratio_from_the_cpu_profile():
    g = train_graph()
    model = ComputeModel(g, profiles(g, "cpu", per_sample_us=100.0, constant_us=50.0))
    cpu = CATALOG["cpu"]
    mm = g.index["mm0"]
    flops, touched = g.ops[mm].flops, model.mem_bytes[mm]
    ratio = max(flops / V100.flops_per_s, touched / V100.mem_bw_bytes_per_s) / max(
        flops / cpu.flops_per_s, touched / cpu.mem_bw_bytes_per_s)
    assert model.times(V100, 8)[mm] == pytest.approx(max(800e-6 * ratio, GPU_LAUNCH_FLOOR_S))
    assert model.source_for(V100) == "cpu" and model.profiled_types == ["cpu"]
    assert (model.times(T4, 8) >= model.times(V100, 8)).all()


def test_times_are_cached_and_read_only():
    g = train_graph()
    model = ComputeModel(g)
    a = model.times(V100, 3.0)
    assert model.times(V100, 3.0) is a
    with pytest.raises(ValueError):
        a[0] = 1.0


def test_communication_formulas():
    nbytes, gbps = 8e6, 80.0
    bw = bytes_per_s(gbps)
    assert bw == 1e10
    assert transfer_time(nbytes, gbps) == pytest.approx(LATENCY_S + 8e-4)
    assert ring_allreduce_time(nbytes, 1, gbps) == 0.0
    assert ring_allreduce_time(nbytes, 4, gbps) == pytest.approx(1.5 * 8e-4 + 6 * LATENCY_S)
    # One machine: the hierarchical form is the plain ring.
    assert hierarchical_allreduce_time(nbytes, [4], [gbps], 1.0) == pytest.approx(ring_allreduce_time(nbytes, 4, gbps))
    # Two machines of two: reduce-scatter + all-gather inside, ring across.
    inside = 0.5 * 8e-4 + LATENCY_S
    assert hierarchical_allreduce_time(nbytes, [2, 2], [gbps, gbps], 8.0) == pytest.approx(
        2 * inside + ring_allreduce_time(nbytes, 2, 8.0))
    assert broadcast_time(nbytes, 4, gbps) == pytest.approx(8e-4 + 3 * LATENCY_S)
    assert allgather_time(nbytes, 4, gbps) == pytest.approx(0.75 * 8e-4 + 3 * LATENCY_S)
    # PS: three workers behind one link queue; push and pull.
    assert ps_time(nbytes, {gbps: 3}) == pytest.approx(2 * 3 * transfer_time(nbytes, gbps))
    # A ring beats a PS for many workers, as it should.
    assert ring_allreduce_time(nbytes, 8, gbps) < ps_time(nbytes, {gbps: 7})


def test_slower_types_are_slower_by_roofline():
    g = train_graph()
    model = ComputeModel(g)
    assert model.times(T4, 8).sum() > model.times(V100, 8).sum() > model.times(lookup_gpu("H100-80GB"), 8).sum()
    assert np.all(model.times(V100, 16) >= model.times(V100, 8))


def _with_overhead(graph, device_type, table):
    """table: {batch: {op name: [(time_us, overhead_us) per run]}}"""
    return pd.DataFrame(
        [(graph.model, op, device_type, b, run, t, o) for b, ops in table.items() for op, runs in ops.items()
         for run, (t, o) in enumerate(runs)],
        columns=["model", "op", "device_type", "batch_size", "run", "time_us", "overhead_us"],
    )


def test_measured_executor_overhead_is_added_per_op_on_its_own_device_type():
    g = train_graph()
    cpu = CATALOG["cpu"]
    mm, loss, x = g.index["mm0"], g.index["loss"], g.index["x"]
    model = ComputeModel(g, _with_overhead(g, "cpu", {
        4: {"mm0": [(40, 3), (41, 2), (900, 2)], "loss": [(0, 1), (0, 1), (0, 1)], "x": [(0, 0)] * 3},
        8: {"mm0": [(80, 4), (80, 4), (80, 4)], "loss": [(0, 1), (0, 1), (0, 1)], "x": [(0, 0)] * 3},
    }))
    at = lambda b: model.times(cpu, b)  # noqa: E731
    assert at(4)[mm] == pytest.approx((41 + 2) * 1e-6)  # medians of the kernel and of the overhead, added
    assert at(8)[mm] == pytest.approx((80 + 4) * 1e-6)
    assert at(6)[mm] == pytest.approx((60.5 + 3) * 1e-6)  # both interpolated over the batch
    # A 0 µs kernel that ran still costs its dispatch; an op TF never ran (fed) costs nothing, no floor.
    assert at(6)[loss] == pytest.approx(1e-6) and at(6)[x] == 0.0
    # The same kernels without a measured overhead: floored at the CPU's 1 µs, as before.
    plain = ComputeModel(g, _with_overhead(g, "cpu", {4: {"x": [(0, None)]}, 8: {"x": [(0, None)]}}))
    assert plain.times(cpu, 6)[x] == pytest.approx(1e-6)


def test_overhead_is_per_node_not_per_sample_and_never_makes_an_op_negative():
    g = train_graph()
    cpu = CATALOG["cpu"]
    mm = g.index["mm0"]
    one = ComputeModel(g, _with_overhead(g, "cpu", {4: {"mm0": [(40, 5)]}}))
    # From one profiled batch the kernel scales with the batch, the per-node overhead does not.
    assert one.times(cpu, 8)[mm] == pytest.approx((80 + 5) * 1e-6)
    # Tracing can add more to a kernel than the executor spends around it: the net is negative, the op is not.
    net = ComputeModel(g, _with_overhead(g, "cpu", {4: {"mm0": [(3, -5)]}, 8: {"mm0": [(6, -5)]}}))
    assert net.times(cpu, 4)[mm] == 0.0 and net.times(cpu, 8)[mm] == pytest.approx(1e-6)


def test_other_device_types_scale_the_kernels_without_the_cpu_executors_overhead():
    g = train_graph()
    mm = g.index["mm0"]
    kernels = {4: {"mm0": [(40, 0)] * 3}, 8: {"mm0": [(80, 0)] * 3}}
    heavy = {4: {"mm0": [(40, 500)] * 3}, 8: {"mm0": [(80, 500)] * 3}}
    a = ComputeModel(g, _with_overhead(g, "cpu", kernels)).times(V100, 8)[mm]
    b = ComputeModel(g, _with_overhead(g, "cpu", heavy)).times(V100, 8)[mm]
    assert a == b
    assert ComputeModel(g, _with_overhead(g, "cpu", heavy)).times(CATALOG["cpu"], 8)[mm] == pytest.approx(580e-6)
