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


def test_ops_add_up_to_the_measured_step_at_each_profiled_batch():
    """Tracing slowed the kernels at batch 8 more than the executor spends around them: the overhead there is
    negative, and spread per node it lands on the batch-free ops (read0, apply0), whose median over the batches
    would take it to batch 4 as well, and on mm0, which the clamp holds at 0. Each batch's profiled ops still
    add up to that batch's step, kernel plus overhead (4: 40 + 3 + 10 + 2 = 55 us; 8: -10 + 1 + 6 + 107 = 104)."""
    g = train_graph()
    cpu = CATALOG["cpu"]
    runs = lambda t, o: [(t, o)] * 3  # noqa: E731
    model = ComputeModel(g, _with_overhead(g, "cpu", {
        4: {"mm0": runs(40, 0), "read0": runs(3, 0), "apply0": runs(10, 2), "loss": runs(0, 0)},
        8: {"mm0": runs(80, -90), "read0": runs(3, -2), "apply0": runs(10, -4), "loss": runs(107, 0)},
    }))
    profiled = [g.index[name] for name in ("mm0", "read0", "apply0", "loss")]
    at = lambda b: model.times(cpu, b)[profiled]  # noqa: E731
    assert at(4).sum() == pytest.approx(55e-6)  # smoothed and clamped alone: 40 + 2 + 9 + 0 = 51
    assert at(8).sum() == pytest.approx(104e-6)  # alone: 0 + 2 + 9 + 107
    assert at(6).sum() == pytest.approx(79.5e-6)  # between two profiled batches: between their steps
    assert (at(4) >= 0).all() and (at(8) >= 0).all()
    # The shape within a step is the smoothed one: the batch-free ops cost the same share at both batches.
    assert at(4)[1] / at(4)[2] == pytest.approx(at(8)[1] / at(8)[2])


def test_other_device_types_scale_the_kernels_without_the_cpu_executors_overhead():
    g = train_graph()
    mm = g.index["mm0"]
    kernels = {4: {"mm0": [(40, 0)] * 3}, 8: {"mm0": [(80, 0)] * 3}}
    heavy = {4: {"mm0": [(40, 500)] * 3}, 8: {"mm0": [(80, 500)] * 3}}
    a = ComputeModel(g, _with_overhead(g, "cpu", kernels)).times(V100, 8)[mm]
    b = ComputeModel(g, _with_overhead(g, "cpu", heavy)).times(V100, 8)[mm]
    assert a == b
    assert ComputeModel(g, _with_overhead(g, "cpu", heavy)).times(CATALOG["cpu"], 8)[mm] == pytest.approx(580e-6)


# ---- racks: the all-reduce by levels ---------------------------------------


def _two_racks(oversubscription: float):
    """2 racks x 2 machines x 2 GPUs: 100 Gbit/s inside a machine, 50 between machines of a rack, and
    racks joined by uplinks giving one flow 40 Gbit/s, oversubscribed `oversubscription`:1, 20 µs."""
    from tag_core.cluster import parse_topology

    return parse_topology({
        "name": "two-racks", "inter_gbps": 50,
        "machines": [{"name": f"m{i}", "gpu": "V100-16GB", "count": 2, "intra_gbps": 100, "rack": f"r{i // 2}"}
                     for i in range(4)],
        "racks": [{"name": "r0"}, {"name": "r1"}],
        "uplinks": {"rack": {"gbps": 40, "oversubscription": oversubscription, "latency_us": 20}}})


def _allreduce(topo, machines, nbytes):
    from tag_core.simulate.comm import CommModel

    comm = CommModel()
    per_machine = [topo.machines[m].count for m in machines]
    intra = [topo.machines[m].intra_gbps for m in machines]
    return comm.allreduce(nbytes, per_machine, intra, 1.0, tiers=comm.allreduce_tiers(topo, machines))


def test_hierarchical_allreduce_across_an_oversubscribed_link_costs_the_formula():
    topo, nbytes = _two_racks(4.0), 1e8
    in_machine = 2 * (0.5 * nbytes / 12.5e9 + LATENCY_S)  # reduce-scatter + all-gather over 2 GPUs at 100 Gbit/s
    in_rack = 2 * (0.5 * nbytes / 6.25e9 + LATENCY_S)  # the same over 2 machines at 50 Gbit/s
    # Across racks both machines of a rack send at once: capacity 2 * 40 / 4 = 20 Gbit/s, 10 each (1.25e9 B/s),
    # each carrying its half of the tensor, in a ring of 2 racks.
    across = 2 * (0.5 * (nbytes / 2) / 1.25e9 + 20e-6)
    assert in_machine + in_rack + across == pytest.approx(0.064088)
    assert _allreduce(topo, [0, 1, 2, 3], nbytes) == pytest.approx(in_machine + in_rack + across)
    # Kept inside one rack the tiers stop there: cheaper than across, by the uplink's term.
    within = _allreduce(topo, [0, 1], nbytes)
    assert within == pytest.approx(in_machine + in_rack) and within < _allreduce(topo, [0, 1, 2, 3], nbytes)
    # One machine per rack: one flow per uplink gets 2 * 40 / 4 = 20 Gbit/s, but carries the whole tensor.
    assert _allreduce(topo, [0, 2], nbytes) == pytest.approx(in_machine + 2 * (0.5 * nbytes / 2.5e9 + 20e-6))


def test_uplink_contention_counts_only_when_oversubscribed():
    nbytes = 1e8
    full = _two_racks(1.0)  # capacity 80 Gbit/s per rack: two flows get 40 each, as one alone does
    one_each = _allreduce(full, [0, 2], nbytes)
    both = _allreduce(full, [0, 1, 2, 3], nbytes)
    across_both = 2 * (0.5 * (nbytes / 2) / 5e9 + 20e-6)
    assert both - _allreduce(full, [0, 1], nbytes) == pytest.approx(across_both)
    assert one_each - 2 * (0.5 * nbytes / 12.5e9 + LATENCY_S) == pytest.approx(2 * (0.5 * nbytes / 5e9 + 20e-6))
    # Array sizes at once, as the simulator asks.
    sizes = np.array([1e6, 1e8])
    assert _allreduce(full, [0, 1, 2, 3], sizes)[1] == pytest.approx(both)


def test_flat_topologies_get_todays_hierarchical_allreduce():
    from tag_core.cluster import load_topology
    from tag_core.simulate.comm import CommModel

    topo = load_topology("examples/topologies/testbed.json")
    machines = [0, 2, 3, 5]
    ring = list(zip(machines, machines[1:] + machines[:1]))
    inter = min(topo.bandwidth_gbps(a, b) for a, b in ring)
    per_machine = [topo.machines[m].count for m in machines]
    intra = [topo.machines[m].intra_gbps for m in machines]
    sizes = np.array([1e3, 1e6, 5e7])
    comm = CommModel()
    tiers = comm.allreduce_tiers(topo, machines)
    assert len(tiers) == 1 and comm.ring_gbps(topo, machines) == inter
    assert comm.allreduce(sizes, per_machine, intra, inter, tiers=tiers) == pytest.approx(
        hierarchical_allreduce_time(sizes, per_machine, intra, inter))


def test_pods_add_a_tier_and_levels_set_latency_and_bandwidth():
    from tag_core.cluster import parse_topology
    from tag_core.simulate.comm import CommModel

    machines = [{"name": f"m{i}", "gpu": "T4", "count": 1, "intra_gbps": 64, "rack": f"r{i // 2}"} for i in range(8)]
    topo = parse_topology({"name": "pods", "inter_gbps": 50, "machines": machines,
                           "racks": [{"name": f"r{j}", "pod": f"p{j // 2}"} for j in range(4)],
                           "uplinks": {"rack": {"gbps": 40, "oversubscription": 2, "latency_us": 20},
                                       "pod": {"gbps": 30, "oversubscription": 4, "latency_us": 50}}})
    comm = CommModel()
    tiers = comm.allreduce_tiers(topo, range(8))
    assert [t.level for t in tiers] == ["rack", "pod", "cluster"]
    # Racks: 2 flows each on 2 * 40 / 2 = 40 Gbit/s, a half each; pods: 4 flows on 4 * 30 / 4 = 30 Gbit/s
    # (7.5 each, below the rack's 20), a quarter each.
    assert tiers[1].seconds_per_byte.tolist() == pytest.approx([0.5 / bytes_per_s(20)] * 2)
    assert tiers[2].seconds_per_byte.tolist() == pytest.approx([0.25 / bytes_per_s(7.5)])
    expected = sum(2 * ((m - 1) / m * 1e8 * s + (m - 1) * lat) for m, s, lat in
                   [(2, 1 / bytes_per_s(50), LATENCY_S), (2, 0.5 / bytes_per_s(20), 20e-6),
                    (2, 0.25 / bytes_per_s(7.5), 50e-6)])
    assert comm.allreduce(1e8, [1] * 8, [64.0] * 8, 1.0, tiers=tiers) == pytest.approx(expected)
    gbps, latency = comm.pair_terms(topo, np.array([0, 0, 0, 0]), np.array([0, 1, 2, 7]))
    assert gbps.tolist() == [64, 50, 40, 30] and latency.tolist() == pytest.approx([LATENCY_S, LATENCY_S, 20e-6, 50e-6])
    # A calibration's inter class is the in-rack level: uplinks keep their figures.
    calibrated = CommModel(link_gbps={"inter": 10.0})
    matrix = calibrated.machine_bandwidth(topo)
    assert matrix[0, 1] == 10 and matrix[0, 2] == 40 and matrix[0, 7] == 30
    assert calibrated.pair_terms(topo, 0, 1)[0] == 10


def test_op_medians_add_up_to_the_median_step():
    g = train_graph()
    cpu = CATALOG["cpu"]
    mm, loss = g.index["mm0"], g.index["loss"]
    # Each op is slow in another run: the medians (40 + 5 + 4 = 49 µs) miss the median step, 53 µs.
    runs = {4: {"mm0": [(40, 0), (40, 0), (60, 0)], "loss": [(5, 4), (9, 4), (5, 0)]}}
    model = ComputeModel(g, _with_overhead(g, "cpu", runs))
    times = model.times(cpu, 4)
    step = sorted(sum(t + o for t, o in (ops[r] for ops in runs[4].values())) for r in range(3))[1]
    assert step == 53 and times[[mm, loss]].sum() == pytest.approx(step * 1e-6)
    assert times[mm] / times[loss] == pytest.approx(40 / 9)  # scaled alike: each op keeps its share
    # With one run per batch, or runs whose medians already add up to the median step, nothing changes.
    single = ComputeModel(g, _with_overhead(g, "cpu", {4: {"mm0": [(40, 2)], "loss": [(5, 1)]}}))
    assert single.times(cpu, 4)[[mm, loss]] == pytest.approx([42e-6, 6e-6])
