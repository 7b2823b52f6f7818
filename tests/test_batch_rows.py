"""A split group's replicas hold whole rows of the batch, in the simulator as in the emitted graph."""

from __future__ import annotations

import numpy as np
import pytest
from simgraphs import BATCH, profiles, topology, train_graph

from tag_core.search.baselines import device_speed

from tag_core.emit.place import SPLIT, place_ops
from tag_core.simulate import Simulator, Strategy
from tag_core.simulate.batch_rows import balanced_rows, balanced_shares, split_batch
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


def _brute_force_makespan(batch: int, device_type: list[int], step) -> float:
    """The least slowest-replica time over every split of `batch` whole rows (0 rows: no replica)."""
    best = np.inf

    def walk(d: int, left: int, slowest: float) -> None:
        nonlocal best
        if d == len(device_type):
            best = min(best, slowest) if left == 0 else best
            return
        for r in range(left + 1):
            walk(d + 1, left - r, max(slowest, step(device_type[d], r) if r else 0.0))

    walk(0, batch, 0.0)
    return best


def test_balanced_rows_finish_the_slowest_replica_first():
    """Affine step times (a fixed cost per step plus a cost per row): the greedy split is as good as the best
    of every split, and it can differ from a split by speed."""
    rng = np.random.default_rng(0)
    for _ in range(30):
        types = rng.integers(0, 3, size=int(rng.integers(2, 5))).tolist()
        fixed, per_row = rng.uniform(0, 5, size=3), rng.uniform(0.5, 3, size=3)
        step = lambda t, r: fixed[t] + per_row[t] * r  # noqa: E731
        batch = int(rng.integers(1, 9))
        rows = balanced_rows(batch, np.array(types), 1 / per_row[types], step)
        assert rows.sum() == batch and (rows >= 0).all()
        slowest = max(step(t, r) for t, r in zip(types, rows.tolist()) if r)
        assert slowest == pytest.approx(_brute_force_makespan(batch, types, step))


def test_balanced_rows_leave_a_device_whose_first_row_would_end_last_without_rows():
    step = lambda t, r: (1.0 + r) if t == 0 else 100.0 * r  # noqa: E731
    assert balanced_rows(4, np.array([1, 0]), np.array([0.01, 1.0]), step).tolist() == [0, 4]
    # A type's devices get rows as even as whole rows allow, the spare to the earlier one.
    assert balanced_rows(5, np.array([0, 0]), np.ones(2), step).tolist() == [3, 2]


def test_balanced_shares_even_out_a_fixed_cost_that_a_split_by_speed_does_not():
    """A V100 and a T4 with a fixed cost per step: by speed (on even shares) 8 rows split 6 / 2, and the T4's
    two rows end last; the balanced split gives the V100 7, and the slowest replica's compute drops."""
    g = train_graph(layers=1)
    topo = topology(("a", V100, 1, 100.0), ("b", T4, 1, 100.0), inter_gbps=10.0)
    sim = Simulator(g, topo, profiles(g, V100, per_sample_us=10.0, constant_us=20.0))
    speed = device_speed(sim)
    balanced = split_batch(BATCH, balanced_shares(sim, speed), speed)
    by_speed = split_batch(BATCH, speed, speed)
    assert by_speed.tolist() == [6, 2] and balanced.tolist() == [7, 1]
    busy = {name: sim.run(Strategy.uniform(len(g.ops), 2, 2, "allreduce", batch_shares=shares)).busy_s.max()
            for name, shares in (("speed", by_speed), ("balanced", balanced))}
    assert busy["balanced"] < busy["speed"]


def test_a_device_the_balanced_split_leaves_without_rows_still_serves_a_group_of_its_own():
    """A T4 whose first row would end after the V100's eighth: no rows beside the V100, all of them alone."""
    g = train_graph(layers=1)
    topo = topology(("a", V100, 1, 100.0), ("b", T4, 1, 100.0), inter_gbps=10.0)
    sim = Simulator(g, topo, profiles(g, V100, per_sample_us=10.0, constant_us=200.0))
    speed = device_speed(sim)
    shares = balanced_shares(sim, speed)
    assert split_batch(BATCH, shares, speed).tolist() == [BATCH, 0]
    both = Strategy.uniform(len(g.ops), 2, 2, "allreduce", batch_shares=shares)
    assert (sim.run(both).busy_s > 0).tolist() == [True, False]
    alone = Strategy.uniform(len(g.ops), 2, 2, "allreduce", batch_shares=shares, mask=np.array([False, True]))
    assert (sim.run(alone).busy_s > 0).tolist() == [False, True]


def test_balanced_rows_stop_past_the_most_rows_a_device_may_take():
    step = lambda t, r: 1.0 + r  # noqa: E731
    assert balanced_rows(32, np.zeros(2, dtype=int), np.ones(2), step, max_rows=16).tolist() == [16, 16]
    assert balanced_rows(33, np.zeros(2, dtype=int), np.ones(2), step, max_rows=16) is None
