"""Simulator tests with answers worked out by hand from the cost model's formulas."""

from __future__ import annotations

import numpy as np
import pytest
from simgraphs import BATCH, W_BYTES, calibration, fixed_profiles, profiles, topology, train_graph

from tag_core.capture import Edge, Op, OpGraph, Variable
from tag_core.errors import TagInputError
from tag_core.simulate import Simulator, Strategy, simulate
from tag_core.simulate.cost import (
    LATENCY_S,
    allgather_time,
    broadcast_time,
    bytes_per_s,
    hierarchical_allgather_time,
    ring_allreduce_time,
    transfer_time,
)
from tag_core.simulate.expand import place
from tag_core.simulate.simulator import _ps_classes

V100 = "V100-32GB"


def _dp(graph, topo, shares=None, option="allreduce", **kw) -> Strategy:
    return Strategy.uniform(len(graph.ops), topo.num_machines, topo.num_devices, option, batch_shares=shares, **kw)


def _times(graph, device_type, batch, per_sample_us=10.0, constant_us=5.0):
    """What the profile says each op takes at `batch` (medians of the fixture's runs)."""
    return {op.name: 1e-6 * (per_sample_us * batch if op.batch_scaled else constant_us) for op in graph.ops}


def test_one_device_is_the_sum_of_op_times():
    g = train_graph(layers=2)
    topo = topology(("m", V100, 1, 100.0))
    result = simulate(g, topo, _dp(g, topo), profiles(g, V100))
    assert result.iteration_time_s == pytest.approx(sum(_times(g, V100, BATCH).values()), rel=1e-9)
    assert result.busy_s[0] == pytest.approx(result.iteration_time_s)
    assert result.idle_s[0] == pytest.approx(0.0, abs=1e-12)
    assert sum(result.comm_s.values()) == 0.0
    # Every op ran, in a topological order, back to back.
    order = np.argsort(result.op_start_s, kind="stable")
    assert np.allclose(result.op_start_s[order][1:], result.op_end_s[order][:-1])
    for e in g.edges:
        assert result.op_end_s[e.src] <= result.op_start_s[e.dst] + 1e-15


def test_two_device_data_parallel_matches_the_allreduce_formula():
    g = train_graph(layers=1)
    intra = 50.0
    topo = topology(("m", V100, 2, intra))
    result = simulate(g, topo, _dp(g, topo, overlap=False), profiles(g, V100))
    half = _times(g, V100, BATCH / 2)
    compute = sum(t for name, t in half.items() if not name.startswith("apply"))
    allreduce = 2 * (2 - 1) / 2 * W_BYTES / bytes_per_s(intra) + 2 * (2 - 1) * LATENCY_S
    assert allreduce == pytest.approx(ring_allreduce_time(W_BYTES, 2, intra))
    expected = compute + allreduce + half["apply0"]
    assert result.iteration_time_s == pytest.approx(expected, rel=1e-9)
    assert result.comm_s["allreduce"] == pytest.approx(allreduce)
    assert result.simulated_slots == 1  # the two devices are interchangeable
    assert np.allclose(result.busy_s, compute + half["apply0"])


def test_gradient_sync_overlaps_the_backward_pass_only_when_allowed():
    g = train_graph(layers=3)
    topo = topology(("m", V100, 2, 10.0))
    sim = Simulator(g, topo, profiles(g, V100))
    overlapped = sim.run(_dp(g, topo, overlap=True))
    after = sim.run(_dp(g, topo, overlap=False))
    assert overlapped.comm_s == after.comm_s
    assert overlapped.iteration_time_s < after.iteration_time_s
    # Without overlap the first AllReduce waits for the last gradient op.
    last_gradient = max(after.op_end_s[i] for i, op in enumerate(g.ops) if op.is_gradient)
    first_apply = min(after.op_start_s[i] for i, op in enumerate(g.ops) if op.is_apply)
    assert first_apply >= last_gradient + ring_allreduce_time(W_BYTES, 2, 10.0) - 1e-12


def test_ps_and_allreduce_differ_as_their_formulas_say():
    g = train_graph(layers=1)
    intra = 20.0
    topo = topology(("m", V100, 4, intra))
    sim = Simulator(g, topo, profiles(g, V100))
    ar = sim.run(_dp(g, topo))
    ps = sim.run(_dp(g, topo, option="ps"))
    # AllReduce: one ring over 4 devices. PS: three workers pull and push through one channel.
    assert ar.comm_s["allreduce"] == pytest.approx(ring_allreduce_time(W_BYTES, 4, intra))
    assert ps.comm_s["allreduce"] == 0.0
    assert ps.comm_s["ps_pull"] == pytest.approx(3 * transfer_time(W_BYTES, intra))
    assert ps.comm_s["ps_push"] == pytest.approx(3 * transfer_time(W_BYTES, intra))
    # Pulls queue before the forward pass and pushes after it, so PS is slower here by at least
    # the serialised pulls + pushes minus the ring it replaces.
    assert ps.iteration_time_s - ar.iteration_time_s >= 6 * transfer_time(W_BYTES, intra) * 0.5
    # Only the PS (device 0) keeps optimizer work; workers pulled copies of the weights.
    assert ps.busy_s[0] > ps.busy_s[1]
    assert ps.peak_memory_bytes[0] > ps.peak_memory_bytes[1]
    # A single device: no difference at all.
    one = topology(("m", V100, 1, intra))
    assert simulate(g, one, _dp(g, one, option="ps")).iteration_time_s == pytest.approx(
        simulate(g, one, _dp(g, one)).iteration_time_s)


def test_parameters_larger_than_memory_are_oom():
    small = train_graph(weight_bytes=1_000_000)
    huge = train_graph(weight_bytes=20_000_000_000)
    topo = topology(("m", "V100-16GB", 2, 100.0))
    assert not simulate(small, topo, _dp(small, topo)).oom
    result = simulate(huge, topo, _dp(huge, topo))
    assert result.oom and result.device_oom.all()
    assert (result.peak_memory_bytes >= 20e9).all()
    assert (result.memory_capacity_bytes == 16e9).all()


def _fan_in(bytes_each: int, inputs: int) -> OpGraph:
    ops = [Op(f"a{i}", "Relu", bytes_each, 0) for i in range(inputs)] + [Op("c", "AddN", 4, 0)]
    edges = [Edge(i, inputs, bytes_each, False, f"a{i}:0") for i in range(inputs)]
    return OpGraph("fan", 1, ops, edges, [])


def test_two_transfers_on_one_link_take_longer_than_one():
    topo = topology(("m0", V100, 1, 100.0), ("m1", V100, 1, 100.0), inter_gbps=10.0)
    nbytes = 50_000_000
    times = []
    for inputs in (1, 2):
        g = _fan_in(nbytes, inputs)
        devices = np.array([0] * inputs + [1])
        s = Strategy.uniform(len(g.ops), 2, 2, "model_parallel", op_devices=devices)
        times.append(simulate(g, topo, s, profiles(g, V100)))  # every op 5 us
    one, two = times
    x = transfer_time(nbytes, 10.0)
    assert one.comm_s["p2p"] == pytest.approx(x)
    assert two.comm_s["p2p"] == pytest.approx(2 * x)
    # The second transfer queues behind the first on the one link.
    assert two.iteration_time_s - one.iteration_time_s == pytest.approx(x, rel=1e-3)
    # Where a calibration measured the gap between independent transfers, their latencies overlap: the link
    # is held for the gap and the bytes.
    from tag_core.simulate import CommModel

    g = _fan_in(nbytes, 2)
    s = Strategy.uniform(len(g.ops), 2, 2, "model_parallel", op_devices=np.array([0, 0, 1]))
    gap = 1e-4
    times = [Simulator(g, topo, profiles(g, V100), comm=comm).run(s).iteration_time_s
             for comm in (CommModel(), CommModel(transfer_gap_s=gap))]
    assert times[0] - times[1] == pytest.approx(LATENCY_S - gap)


def test_transfers_on_different_links_run_in_parallel():
    g = OpGraph("pair", 1, [Op("a", "Relu", 10**8, 0), Op("b", "Relu", 10**8, 0), Op("c", "Neg", 4, 0), Op("d", "Neg", 4, 0)],
                [Edge(0, 2, 10**8, False, "a:0"), Edge(1, 3, 10**8, False, "b:0")], [])
    topo = topology(("m0", V100, 1, 100.0), ("m1", V100, 1, 100.0), ("m2", V100, 1, 100.0), inter_gbps=10.0)
    same = simulate(g, topo, Strategy.uniform(4, 3, 3, "model_parallel", op_devices=np.array([0, 0, 1, 1])))
    apart = simulate(g, topo, Strategy.uniform(4, 3, 3, "model_parallel", op_devices=np.array([0, 0, 1, 2])))
    assert apart.iteration_time_s < same.iteration_time_s


def test_a_tensor_goes_once_to_a_device_however_many_of_its_ops_read_it():
    """a's tensor is read by b and c on the other device (as an Adam update's Sub and Square read one gradient):
    TF sends it once, and c, after b on that device, does not wait for a second copy. d reads it too, on a
    third device: one more transfer, on another link."""
    nbytes = 50_000_000
    ops = [Op("a", "Relu", nbytes, 0), Op("b", "Neg", 4, 0), Op("c", "Neg", 4, 0), Op("d", "Neg", 4, 0)]
    edges = [Edge(0, 1, nbytes, False, "a:0"), Edge(0, 2, nbytes, False, "a:0"), Edge(0, 3, nbytes, False, "a:0")]
    g = OpGraph("fan-out", 1, ops, edges, [])
    topo = topology(("m0", V100, 1, 100.0), ("m1", V100, 1, 100.0), ("m2", V100, 1, 100.0), inter_gbps=10.0)
    one = simulate(g, topo, Strategy.uniform(4, 3, 3, "model_parallel", op_devices=np.array([0, 1, 1, 1])))
    two = simulate(g, topo, Strategy.uniform(4, 3, 3, "model_parallel", op_devices=np.array([0, 1, 1, 2])))
    x = transfer_time(nbytes, 10.0)
    assert one.comm_s["p2p"] == pytest.approx(x) and two.comm_s["p2p"] == pytest.approx(2 * x)
    c = g.index["c"]
    assert one.op_start_s[c] == pytest.approx(one.op_end_s[g.index["b"]])  # after b, not after a second copy
    # Two producers' tensors are two, whatever a hand-built graph names them.
    named_alike = OpGraph("fan-in", 1, ops, [Edge(0, 2, nbytes, False, "t:0"), Edge(1, 2, nbytes, False, "t:0")], [])
    assert simulate(named_alike, topo, Strategy.uniform(4, 3, 3, "model_parallel", op_devices=np.array([0, 0, 1, 1]))
                    ).comm_s["p2p"] == pytest.approx(2 * x)
    # The reader kept is the first in the strategy's execution order (SFB moves ops later), not the graph's.
    from tag_core.simulate.expand import _later_readers

    sim = Simulator(g, topo)
    one_pattern = np.zeros(3, dtype=np.int64)  # a -> b, a -> c and a -> d lead to the same devices
    assert sorted(_later_readers(sim, one_pattern, sim.pos).tolist()) == [1, 2]  # b reads first
    assert sorted(_later_readers(sim, one_pattern, sim.pos[::-1].copy()).tolist()) == [0, 1]  # d reads first
    assert _later_readers(sim, np.array([0, 0, 1]), sim.pos).tolist() == [1]  # d's pattern is another
    # A pure dependency is one signal per device too.
    control = OpGraph("fan-out", 1, ops, [Edge(0, 1, 0, False, ""), Edge(0, 2, 0, False, "")], [])
    assert simulate(control, topo, Strategy.uniform(4, 3, 3, "model_parallel", op_devices=np.array([0, 1, 1, 1]))
                    ).comm_s["p2p"] == pytest.approx(LATENCY_S)


def test_a_slower_gpu_type_is_slower():
    g = train_graph(layers=2)
    cpu_profile = profiles(g, "cpu", per_sample_us=200.0, constant_us=20.0)
    fast = simulate(g, topology(("m", "H100-80GB", 1, 100.0)), _dp(g, topology(("m", "H100-80GB", 1, 100.0))), cpu_profile)
    slow = simulate(g, topology(("m", "T4", 1, 100.0)), _dp(g, topology(("m", "T4", 1, 100.0))), cpu_profile)
    assert slow.iteration_time_s > fast.iteration_time_s
    # Without any profile the roofline alone must agree.
    assert simulate(g, topology(("m", "T4", 1, 1.0)), _dp(g, topology(("m", "T4", 1, 1.0)))).iteration_time_s > \
        simulate(g, topology(("m", "H100-80GB", 1, 1.0)), _dp(g, topology(("m", "H100-80GB", 1, 1.0)))).iteration_time_s


def test_uneven_shares_give_uneven_work():
    g = train_graph(layers=2)
    topo = topology(("m", V100, 2, 100.0))
    r = simulate(g, topo, _dp(g, topo, shares=np.array([3.0, 1.0])), profiles(g, V100, batches=(2, 4, 6, 8)))
    assert r.simulated_slots == 2
    assert r.busy_s[0] > r.busy_s[1]


def test_duplicate_computes_the_full_batch_everywhere_without_sync():
    g = train_graph(layers=1)
    topo = topology(("m", V100, 2, 100.0))
    r = simulate(g, topo, _dp(g, topo, option="duplicate"), profiles(g, V100))
    assert sum(r.comm_s.values()) == 0.0
    assert r.iteration_time_s == pytest.approx(sum(_times(g, V100, BATCH).values()))


ACTIVATION_BYTES = 4 * BATCH * 256  # dmm0's output in train_graph, whole batch


def test_sfb_rebuilds_the_gradient_from_all_gathered_factors():
    g = train_graph(layers=1)
    topo = topology(("m", V100, 2, 50.0))
    gw0 = g.index["gw0"]
    r = simulate(g, topo, _dp(g, topo, sfb={"w0": [gw0]}), profiles(g, V100))
    gather = allgather_time(ACTIVATION_BYTES, 2, 50.0)
    assert r.comm_s["allreduce"] == 0.0
    assert r.comm_s["allgather"] == pytest.approx(gather)
    # Every op on its half batch (gw0 does not scale with it), then the factors' all-gather before gw0.
    assert r.iteration_time_s == pytest.approx(sum(_times(g, V100, BATCH / 2).values()) + gather, rel=1e-9)
    plain = simulate(g, topo, _dp(g, topo), profiles(g, V100))
    assert plain.comm_s["allreduce"] == pytest.approx(ring_allreduce_time(W_BYTES, 2, 50.0))
    assert r.iteration_time_s < plain.iteration_time_s  # 64 KiB of factors against a 4 MB gradient


def test_sfb_in_a_ps_group_gathers_the_factors_on_the_ps_only():
    g = train_graph(layers=1)
    topo = topology(("m", V100, 2, 50.0))
    r = simulate(g, topo, _dp(g, topo, option="ps", sfb={"w0": [g.index["gw0"]]}), profiles(g, V100))
    assert r.comm_s["ps_push"] == 0.0
    assert r.comm_s["gather"] == pytest.approx(transfer_time(ACTIVATION_BYTES / 2, 50.0))
    assert r.comm_s["ps_pull"] == pytest.approx(transfer_time(W_BYTES, 50.0))


def test_split_rows_wanted_whole_on_the_same_devices_are_all_gathered():
    g = train_graph(layers=1)
    topo = topology(("a", V100, 2, 100.0), ("b", V100, 3, 50.0), inter_gbps=10.0)
    tail = np.array([op.name in ("gw0", "apply0") for op in g.ops], dtype=np.int64)
    s = Strategy(tail, np.ones((2, 2), bool), ["allreduce", "duplicate"], np.ones(5))
    r = simulate(g, topo, s, profiles(g, V100), batch_size=10)  # two rows a device
    # dmm0's rows feed the duplicated gradient: a ring inside each machine, across them, then spread.
    a = ACTIVATION_BYTES * 10 / BATCH
    expected = hierarchical_allgather_time(a, np.full(5, 0.2), [2, 3], [100.0, 50.0], 10.0)
    inside = max(allgather_time(0.4 * a, 2, 100.0), allgather_time(0.6 * a, 3, 50.0))
    spread = max(broadcast_time(0.6 * a, 2, 100.0), broadcast_time(0.4 * a, 3, 50.0))
    by_hand = inside + allgather_time(2 * 0.6 * a, 2, 10.0) + spread  # machine pieces padded to the larger
    assert expected == pytest.approx(by_hand)
    assert r.comm_s["allgather"] == pytest.approx(expected)
    assert r.comm_s["p2p"] == 0.0 and r.comm_s["gather"] == 0.0


def test_one_devices_tensor_wanted_on_several_is_broadcast():
    nbytes = 10**7
    g = OpGraph("bcast", 1, [Op("a", "Relu", nbytes, 0), Op("b", "Neg", 4, 0)], [Edge(0, 1, nbytes, False, "a:0")], [])
    topo = topology(("m", V100, 3, 100.0), ("n", V100, 1, 100.0), inter_gbps=10.0)
    s = Strategy(np.array([0, 1]), np.array([[1, 0], [1, 1]], bool), ["model_parallel", "duplicate"], np.ones(4),
                 op_devices=np.array([0, -1]))
    r = simulate(g, topo, s)
    assert r.comm_s["broadcast"] == pytest.approx(broadcast_time(nbytes, 4, 10.0))
    assert r.comm_s["p2p"] == 0.0
    # A pure dependency (no bytes) is a signal to each device, not a collective.
    dep = OpGraph("dep", 1, g.ops, [Edge(0, 1, 0, False, "")], [])
    r = simulate(dep, topo, s)
    assert r.comm_s["broadcast"] == 0.0 and r.comm_s["p2p"] == pytest.approx(3 * LATENCY_S)


def test_symmetry_shortcut_is_exact_and_results_are_deterministic():
    g = train_graph(layers=3)
    topo = topology(("a", V100, 3, 100.0), ("b", "T4", 2, 50.0), inter_gbps=25.0)
    prof = profiles(g, V100)
    sim = Simulator(g, topo, prof)
    s = _dp(g, topo)
    merged = sim.run(s)
    assert merged.simulated_slots == 2
    # Mixed placement forces full expansion of the same work: a second group on the same devices.
    s2 = Strategy(np.arange(len(g.ops)) % 2, np.ones((2, 2), bool), ["allreduce", "allreduce"], np.ones(5))
    split_groups = sim.run(s2)
    assert split_groups.iteration_time_s == pytest.approx(merged.iteration_time_s)
    again = Simulator(g, topo, prof).run(s)
    for field in ("peak_memory_bytes", "busy_s", "op_start_s", "op_end_s", "op_idle_after_s"):
        assert np.array_equal(getattr(merged, field), getattr(again, field))
    assert merged.iteration_time_s == again.iteration_time_s
    assert merged.comm_s == again.comm_s


def test_multi_machine_allreduce_is_hierarchical_and_waits_for_slow_devices():
    g = train_graph(layers=1)
    topo = topology(("a", V100, 2, 100.0), ("b", V100, 2, 100.0), inter_gbps=10.0)
    r = simulate(g, topo, _dp(g, topo), profiles(g, V100))
    from tag_core.simulate.cost import hierarchical_allreduce_time
    assert r.comm_s["allreduce"] == pytest.approx(hierarchical_allreduce_time(W_BYTES, [2, 2], [100.0, 100.0], 10.0))


def test_timeline_holds_compute_and_communication():
    g = train_graph(layers=2)
    topo = topology(("m", V100, 2, 100.0))
    r = simulate(g, topo, _dp(g, topo), profiles(g, V100), timeline=True)
    tl = r.timeline
    assert len(tl.compute_op) == 2 * len(g.ops)
    assert set(tl.compute_device.tolist()) == {0, 1}
    assert len(tl.comm_start) == 2 * 2  # two AllReduces, shown on both devices
    assert (tl.compute_end >= tl.compute_start).all() and tl.compute_end.max() <= r.iteration_time_s + 1e-12


def test_bad_strategies_name_the_field():
    g = train_graph()
    topo = topology(("m", V100, 2, 100.0))
    sim = Simulator(g, topo)
    with pytest.raises(TagInputError, match="batch_shares"):
        sim.run(_dp(g, topo, shares=np.ones(3)))
    with pytest.raises(TagInputError, match="op_groups"):
        sim.run(Strategy.uniform(3, 1, 2))
    two = topology(("a", V100, 1, 100.0), ("b", V100, 1, 100.0))
    with pytest.raises(TagInputError, match=r"groups\[0\]"):
        Simulator(g, two).run(_dp(g, two, shares=np.array([1.0, 0.0]), mask=np.array([False, True])))


@pytest.mark.slow
def test_zoo_models_simulate_on_the_example_testbed(tmp_path):
    from pathlib import Path

    from tag_core.capture import capture, resolve_model
    from tag_core.cluster import load_topology

    topo = load_topology(Path(__file__).parent.parent / "examples" / "topologies" / "testbed.json")
    g = capture(resolve_model("small_cnn")).graph
    sim = Simulator(g, topo)
    for option in ("allreduce", "ps", "duplicate", "model_parallel"):
        r = sim.run(_dp(g, topo, option=option))
        assert 0 < r.iteration_time_s < 10 and not r.oom
        assert np.all(r.op_end_s >= r.op_start_s)
        assert np.all(r.busy_s <= r.iteration_time_s + 1e-12)


def test_variables_an_op_takes_together_share_a_ps_class():
    variables = [Variable(f"v{i}", (2,), "float32", 8, True, "model", None) for i in range(5)]
    loops = [Op("a", "While", 0, 0, variable="v0", other_variables=("v1",)),
             Op("b", "While", 0, 0, variable="v2", other_variables=("v3",)),
             Op("c", "While", 0, 0, variable="v3", other_variables=("v1",))]  # joins the first two
    classes = _ps_classes(OpGraph("m", 1, loops, [], variables), {v.name: i for i, v in enumerate(variables)})
    assert len(set(classes[:4])) == 1 and classes[4] not in classes[:4]


# ---- calibrated communication --------------------------------------------------------------


def test_a_calibration_sets_latency_and_bandwidth_per_link_class():
    from tag_core.simulate import CommModel

    g = train_graph(layers=1)
    topo = topology(("a", V100, 1, 100.0), ("b", V100, 1, 100.0), inter_gbps=25.0)
    comm = CommModel.from_calibration(calibration(topo, per_step_s=2e-3))
    strategy = _dp(g, topo, overlap=False)
    plain = Simulator(g, topo, profiles(g, V100)).run(strategy)
    calibrated = Simulator(g, topo, profiles(g, V100), comm=comm).run(strategy)
    # One device per machine: the ring runs across machines with the measured latency and bandwidth; the
    # measured cost of launching a step comes on top, and so does the client's feed: the input is fed whole
    # to machine a (task 0), which sends machine b its half of the batch.
    ring = ring_allreduce_time(W_BYTES, 2, 7.8, 9e-4)
    assert calibrated.comm_s["allreduce"] == pytest.approx(ring)
    feed = transfer_time(4 * BATCH * 256 / 2, 7.8, 9e-4)
    assert calibrated.iteration_time_s - plain.iteration_time_s == pytest.approx(
        ring - ring_allreduce_time(W_BYTES, 2, 25.0) + 2e-3 + feed)
    # Transfers: a model-parallel chain moves its activations (and its weight, when its update runs on the
    # other machine) across the measured inter link.
    chain = Strategy.uniform(len(g.ops), topo.num_machines, topo.num_devices, "model_parallel")
    moved = Simulator(g, topo, profiles(g, V100), comm=comm).run(chain).comm_s["p2p"]
    unmeasured = Simulator(g, topo, profiles(g, V100)).run(chain).comm_s["p2p"]
    placed = place(Simulator(g, topo, profiles(g, V100)), chain)
    pulls = int(placed.single_dev[g.index["read0"]] != placed.single_dev[g.index["apply0"]])
    activation = 4 * BATCH * 256
    transfers = round((unmeasured - pulls * transfer_time(W_BYTES, 25.0)) / transfer_time(activation, 25.0))
    assert transfers >= 1 and moved == pytest.approx(transfers * transfer_time(activation, 7.8, 9e-4)
                                                     + pulls * transfer_time(W_BYTES, 7.8, 9e-4))


def test_a_measured_collective_is_used_as_it_is():
    from tag_core.simulate import CommModel

    g = train_graph(layers=1)
    topo = topology(("a", V100, 1, 100.0), ("b", V100, 1, 100.0), inter_gbps=25.0)
    comm = CommModel.from_calibration(calibration(topo, {"allreduce": {"inter": {2: (3e-3, 2.0)}}}))
    result = Simulator(g, topo, profiles(g, V100), comm=comm).run(_dp(g, topo, overlap=False))
    assert result.comm_s["allreduce"] == pytest.approx(3e-3 + W_BYTES / bytes_per_s(2.0))
    # A group size it did not measure keeps the ring formula, with the measured latency.
    three = topology(("a", V100, 1, 100.0), ("b", V100, 1, 100.0), ("c", V100, 1, 100.0), inter_gbps=25.0)
    comm3 = CommModel.from_calibration(calibration(three, {"allreduce": {"inter": {2: (3e-3, 2.0)}}}))
    result3 = Simulator(g, three, profiles(g, V100), comm=comm3).run(_dp(g, three, overlap=False))
    assert result3.comm_s["allreduce"] == pytest.approx(ring_allreduce_time(W_BYTES, 3, 7.8, 9e-4))


def test_launching_a_step_costs_what_was_measured_for_the_tasks_it_touches():
    from tag_core.cluster.calibration import Sample
    from tag_core.simulate import CommModel

    g = train_graph(layers=1)
    topo = topology(("a", V100, 1, 100.0), ("b", V100, 1, 100.0), inter_gbps=25.0)
    steps = [Sample("step", None, tasks, None, run, seconds) for tasks, seconds in ((1, 5e-4), (2, 2e-3))
             for run in range(3)]
    comm = CommModel.from_calibration(calibration(topo, per_step_s=2e-3, samples=steps))
    one = Strategy.uniform(len(g.ops), 2, 2, "allreduce", mask=[True, False])  # machine a alone: no communication
    plain = Simulator(g, topo, profiles(g, V100)).run(one).iteration_time_s
    assert Simulator(g, topo, profiles(g, V100), comm=comm).run(one).iteration_time_s - plain == pytest.approx(5e-4)
    assert comm.step_cost(1) == 5e-4 and comm.step_cost(2) == 2e-3 and comm.step_cost(3) == 2e-3


def test_communication_the_compute_cannot_hide_is_charged_to_its_endpoints():
    from tag_core.simulate import CommModel

    nbytes = 12_500_000  # 10 ms at 10 Gbit/s
    g = OpGraph("join", 1, [Op("a", "Relu", nbytes, 0), Op("b", "Relu", 4, 0), Op("c", "AddN", 4, 0)],
                [Edge(0, 2, nbytes, False, "a:0"), Edge(1, 2, 4, False, "b:0")], [])
    topo = topology(("m0", V100, 1, 100.0), ("m1", V100, 1, 100.0), inter_gbps=10.0)
    s = Strategy.uniform(3, 2, 2, "model_parallel", op_devices=np.array([0, 1, 1]))
    x, moving = transfer_time(nbytes, 10.0), nbytes / bytes_per_s(10.0)  # the latency is a wait, not work
    for b_us in (30_000.0, 5.0):  # machine m1 computes b while a's output crosses, or waits for it
        times = {"a": 5.0, "b": b_us, "c": 5.0}
        prof = fixed_profiles(g, V100, times)
        hidden, unhidden = (Simulator(g, topo, prof, comm=CommModel(compute_overlap=share)).run(s).iteration_time_s
                            for share in (1.0, 0.0))
        a, b, c = (1e-6 * times[k] for k in "abc")
        assert hidden == pytest.approx(max(a + x, b) + c)
        # m1 receives on the core that computes b: c waits for both; a device that waits anyway loses nothing.
        assert unhidden == pytest.approx(max(a + x, b + moving) + c)


def test_a_sender_whose_steps_compute_has_just_begun_keeps_its_transfer_waiting():
    from tag_core.simulate import CommModel

    # a (m0) feeds c (m1) and, on m0, s; c computes 30 ms once a's output arrives.
    g = OpGraph("send", 1, [Op("a", "Relu", 4, 0), Op("s", "Relu", 4, 0), Op("c", "Relu", 4, 0)],
                [Edge(0, 1, 4, False, "a:0"), Edge(0, 2, 4, False, "a:0")], [])
    topo = topology(("m0", V100, 1, 100.0), ("m1", V100, 1, 100.0), inter_gbps=10.0)
    delay = 3e-3
    cases = {  # a's and s's time (us), where s runs, and how much later c starts
        "m0 computes s long after a": (5.0, 20_000.0, 0, delay - 5e-6),  # a leaves once m0 has computed 3 ms
        "m0 computes s briefly": (5.0, 1_000.0, 0, 1e-3),  # ... or when m0's chain ends, if sooner
        "m0 idle after a": (5.0, 5.0, 1, 0.0),  # s on m1: nothing holds m0's threads
        "m0 has computed long enough": (10_000.0, 20_000.0, 0, 0.0),  # a ends 10 ms in: its threads preempt s
    }
    for name, (a_us, s_us, s_device, late) in cases.items():
        times = {"a": a_us, "s": s_us, "c": 30_000.0}
        prof = fixed_profiles(g, V100, times)
        strategy = Strategy.uniform(3, 2, 2, "model_parallel", op_devices=np.array([0, s_device, 1]))
        plain, busy = (Simulator(g, topo, prof, comm=CommModel(busy_send_s=d)).run(strategy).iteration_time_s
                       for d in (0.0, delay))
        assert busy - plain == pytest.approx(late, abs=1e-9), name
