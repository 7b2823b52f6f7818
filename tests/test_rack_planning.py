"""The planner on two racks: gradient sync stays inside a rack when the uplink between the racks is slow
and oversubscribed, and spans both racks when the uplink is fast and compute dominates.

A small hand-built training graph (tests/simgraphs.py), no TF capture: the real `plan(...)` that
`tag plan` calls, with a small iteration budget and a fixed seed, so the plan is deterministic.
SFB is off: it rebuilds these matmul gradients from factors a few KB large, and then replicating
across the racks rightly pays whatever the uplink (that choice is tests/test_sfb.py's subject).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from simgraphs import profiles, train_graph

from tag_core.cluster import Machine, Topology, lookup_gpu
from tag_core.cluster.hierarchy import Rack, Uplink
from tag_core.plan.planner import plan
from tag_core.search.mcts import Budget
from tag_core.simulate import Simulator, Strategy

GPU = "V100-32GB"
BUDGET = Budget(iterations=30)
# Machine order: racks listed one after the other, or interleaved so that no "k fastest machines"
# mask is a rack (the planner must still find the rack).
RACK_ORDERS = {"packed": ("r0", "r0", "r1", "r1"), "interleaved": ("r0", "r1", "r0", "r1")}


def _two_racks(racks: tuple[str, ...], uplink_gbps: float, oversubscription: float) -> Topology:
    """Machines of 2 GPUs, 100 Gbit/s between machines of a rack; the racks joined by `uplink_gbps`."""
    machines = tuple(Machine(f"m{i}", lookup_gpu(GPU), 2, 150.0, rack=r) for i, r in enumerate(racks))
    return Topology("two-racks", machines, inter_gbps=100.0, racks=(Rack("r0"), Rack("r1")),
                    rack_uplink=Uplink(uplink_gbps, oversubscription, latency_us=50.0))


def _gradient_racks(graph, topology: Topology, strategy: Strategy) -> list[set[int]]:
    """For each variable whose gradient is synchronised (its gradient op in a replicated group: allreduce
    or ps), the racks of the devices taking part: the group's masked machines with a positive share."""
    index = {op.name: i for i, op in enumerate(graph.ops)}
    device_machine = np.array([d.machine for d in topology.devices])
    machine_rack = topology.hierarchy.machine_rack
    out = []
    for v in graph.variables:
        g = int(strategy.op_groups[index[v.gradient_op]])
        if strategy.options[g] not in ("allreduce", "ps"):
            continue
        devices = np.flatnonzero(strategy.masks[g][device_machine] & (strategy.batch_shares > 0))
        out.append({int(r) for r in machine_rack[device_machine[devices]]})
    return out


def _best_cross_rack_time(sim: Simulator, num_ops: int) -> float:
    """The fastest uniform replicated plan (allreduce or ps) whose machines span both racks."""
    topo = sim.topology
    rack = topo.hierarchy.machine_rack
    best = np.inf
    for bits in itertools.product((False, True), repeat=topo.num_machines):
        mask = np.array(bits)
        if len(set(rack[mask].tolist())) < 2:
            continue
        for option in ("allreduce", "ps"):
            s = Strategy.uniform(num_ops, topo.num_machines, topo.num_devices, option, mask=mask)
            best = min(best, sim.run(s).iteration_time_s)
    return best


@pytest.mark.parametrize("order", sorted(RACK_ORDERS))
def test_large_gradients_over_an_oversubscribed_uplink_are_synchronised_inside_one_rack(order):
    """40 MB gradients per layer, a 1 Gbit/s uplink at 8:1 between the racks: the plan replicates on the
    machines of one rack (more than one machine: the in-rack sync pays), and its time beats every plan
    that syncs across the racks, DP-NCCL among them."""
    g = train_graph(weight_bytes=40_000_000, layers=2)
    prof = profiles(g, GPU, per_sample_us=2000.0)
    topo = _two_racks(RACK_ORDERS[order], uplink_gbps=1.0, oversubscription=8.0)
    result = plan(g, topo, prof, budget=BUDGET, seed=0, sfb=False)
    sim = Simulator(g, topo, prof)
    everywhere = Strategy.uniform(len(g.ops), topo.num_machines, topo.num_devices, "allreduce")
    assert _gradient_racks(g, topo, everywhere) == [{0, 1}, {0, 1}]  # the check sees a sync across the racks

    racks = _gradient_racks(g, topo, result.strategy)
    assert result.one_device is None and len(racks) == len(g.variables)  # every gradient is synchronised...
    assert all(len(r) == 1 for r in racks), racks  # ...inside one rack
    machines = np.flatnonzero(result.strategy.masks.any(axis=0))
    assert len(machines) >= 2  # by more than one machine: the sync inside the rack is worth its cost
    assert result.time_s == pytest.approx(sim.run(result.strategy).iteration_time_s, rel=1e-9)
    assert result.time_s < _best_cross_rack_time(sim, len(g.ops))
    assert result.time_s < result.baselines["dp_nccl"]


@pytest.mark.parametrize("order", sorted(RACK_ORDERS))
def test_compute_heavy_training_over_a_fast_uplink_uses_both_racks(order):
    """Small gradients, heavy compute, a 400 Gbit/s uplink without oversubscription: the racks are as good
    as one, so the plan synchronises gradients across both."""
    g = train_graph(weight_bytes=400_000, layers=2)
    prof = profiles(g, GPU, per_sample_us=2000.0)
    topo = _two_racks(RACK_ORDERS[order], uplink_gbps=400.0, oversubscription=1.0)
    result = plan(g, topo, prof, budget=BUDGET, seed=0, sfb=False)
    racks = _gradient_racks(g, topo, result.strategy)
    assert result.one_device is None
    assert any(r == {0, 1} for r in racks), racks
