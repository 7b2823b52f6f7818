"""A variable lives where its update runs; a device that reads it elsewhere gets it first (as emitted)."""

from __future__ import annotations

import numpy as np
import pytest
from simgraphs import W_BYTES, fixed_profiles, topology, train_graph

from tag_core.simulate import Simulator, Strategy
from tag_core.simulate.cost import transfer_time

V100 = "V100-32GB"


def test_a_model_parallel_read_of_a_variable_updated_elsewhere_pulls_it_from_there():
    g = train_graph(layers=1)
    topo = topology(("m0", V100, 1, 100.0), ("m1", V100, 1, 100.0), inter_gbps=10.0)
    prof = fixed_profiles(g, V100, {op.name: 100.0 for op in g.ops})
    on_m0 = np.zeros(len(g.ops), dtype=np.int64)
    for apply_device, pulled in ((0, 0.0), (1, transfer_time(W_BYTES, 10.0))):
        devices = on_m0.copy()
        devices[g.index["apply0"]] = apply_device  # w0's update, and so w0, on m0 or m1
        strategy = Strategy.uniform(len(g.ops), 2, 2, "model_parallel", op_devices=devices)
        result = Simulator(g, topo, prof).run(strategy)
        # read0 on m0 gets w0 from m1 before the forward pass; the update's gradient goes the other way.
        gradient = transfer_time(W_BYTES, 10.0) if apply_device == 1 else 0.0
        assert result.comm_s.get("p2p", 0.0) == pytest.approx(pulled + gradient), apply_device
        assert "ps_pull" not in result.comm_s or result.comm_s["ps_pull"] == 0.0


def test_ps_reads_still_pull_from_their_ps():
    g = train_graph(layers=2)
    topo = topology(("m0", V100, 1, 100.0), ("m1", V100, 1, 100.0), inter_gbps=10.0)
    prof = fixed_profiles(g, V100, {op.name: 100.0 for op in g.ops})
    result = Simulator(g, topo, prof).run(Strategy.uniform(len(g.ops), 2, 2, "ps"))
    # Two variables, one PS each, round-robin: each worker pulls the one it does not hold.
    assert result.comm_s["ps_pull"] == pytest.approx(2 * transfer_time(W_BYTES, 10.0))
