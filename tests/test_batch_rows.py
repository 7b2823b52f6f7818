"""A split group's replicas hold whole rows of the batch, in the simulator as in the emitted graph."""

from __future__ import annotations

import numpy as np
import pytest
from simgraphs import BATCH, profiles, topology, train_graph

from tag_core.emit.place import SPLIT, place_ops
from tag_core.simulate import Simulator, Strategy
from tag_core.simulate.batch_rows import split_batch
from tag_core.simulate.expand import place

V100, T4 = "V100-16GB", "T4"


def _wide():
    """16 devices for a batch of 8: only half of them can hold a row."""
    return topology(*[(f"m{i}", V100, 4, 100.0) for i in range(4)], inter_gbps=10.0)


@pytest.mark.parametrize("option", ["allreduce", "ps"])
def test_devices_whose_share_rounds_to_no_row_run_no_replica(option):
    g, topo = train_graph(layers=2), _wide()
    s = Strategy.uniform(len(g.ops), 4, 16, option)
    sim = Simulator(g, topo, profiles(g, V100))
    p = place(sim, s)
    assert p.group_active[0].sum() == BATCH
    assert np.allclose(p.group_share[0][p.group_active[0]], 1 / BATCH)
    assert (p.single_dev[p.single_dev >= 0] < BATCH).all()  # PS updates only where a replica runs
    result = sim.run(s)
    assert (result.busy_s[:BATCH] > 0).all() and (result.busy_s[BATCH:] == 0).all()
    # The emitted graph places the same replicas on the same devices.
    placed = place_ops(g, topo, s, profiles(g, V100))
    split = [pl for pl in placed.placements if pl.kind == SPLIT]
    assert [(pl.devices, pl.batches) for pl in split] == [(tuple(range(BATCH)), (1,) * BATCH)]
    assert f"group 0: a batch of {BATCH} leaves 8 of its 16 devices without rows; they get no replica" in placed.notes


def test_a_split_over_fewer_devices_than_rows_is_unchanged():
    """Shares that give whole rows are kept exactly, and every device of the group computes."""
    g = train_graph(layers=2)
    topo = topology(("a", V100, 2, 100.0), ("b", T4, 2, 100.0), inter_gbps=10.0)
    s = Strategy.uniform(len(g.ops), 2, 4, "allreduce", batch_shares=np.array([3.0, 3.0, 1.0, 1.0]))
    p = place(Simulator(g, topo, profiles(g, V100)), s)
    assert p.group_active[0].all()
    assert p.group_share[0] * BATCH == pytest.approx([3, 3, 1, 1])


def test_rounding_gives_the_spare_rows_to_the_fastest_devices():
    """Equal shares of 8 rows over 6 devices: the two spare rows go to the V100s, wherever they are listed."""
    g = train_graph(layers=1)
    for order in ((T4, V100), (V100, T4)):
        topo = topology(("a", order[0], 3, 100.0), ("b", order[1], 3, 100.0), inter_gbps=10.0)
        p = place(Simulator(g, topo, profiles(g, V100)), Strategy.uniform(len(g.ops), 2, 6, "allreduce"))
        rows = np.rint(p.group_share[0] * BATCH).astype(int)
        v100 = np.array([d.gpu.name == V100 for d in topo.devices])
        assert sorted(rows[v100].tolist()) == [1, 2, 2] and rows[~v100].tolist() == [1, 1, 1]


def test_split_batch_is_proportional_and_exact():
    assert split_batch(8, np.array([1.0, 2.0, 3.0, 2.0]), np.ones(4)).tolist() == [1, 2, 3, 2]
    # Equal remainders and speeds: the earlier device.
    assert split_batch(10, np.array([1.0, 1.0, 1.0]), np.ones(3)).tolist() == [4, 3, 3]
    rows = split_batch(33, np.array([0.1, 0.7, 0.2]), np.ones(3)).tolist()
    assert sum(rows) == 33 and rows == [3, 23, 7]
    assert split_batch(2, np.array([1.0, 1.0, 1.0, 1.0]), np.ones(4)).tolist() == [1, 1, 0, 0]
    # Among equal remainders the faster device gets the row, wherever it is listed.
    assert split_batch(2, np.ones(4), np.array([1.0, 3.0, 2.0, 3.0])).tolist() == [0, 1, 0, 1]
