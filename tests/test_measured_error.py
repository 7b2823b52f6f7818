"""The cost model's measured error on a topology (tag_core.plan.measured_error): read from `measured_steps`, and
weighed by the planner, which keeps a distributed plan only when it beats one device even if both predictions
are off by that error in opposite directions."""

from __future__ import annotations

import pytest
from simgraphs import profiles, topology, train_graph

from tag_core import store
from tag_core.plan import plan
from tag_core.plan.measured_error import MeasuredError, measured_error
from tag_core.search import Budget
from tag_core.search.baselines import single
from tag_core.simulate import Simulator

TOPOLOGY = topology(("a", "V100-32GB", 2, 100.0), ("b", "V100-32GB", 2, 100.0), inter_gbps=10.0)


def _row(predicted_ms: float | None, measured_ms: float, topology_hash: str, calibration_hash: str | None) -> dict:
    return {"model": "mlp", "topology": TOPOLOGY.name, "strategy": "tag", "plan_id": None, "graph_hash": None,
            "topology_hash": topology_hash, "calibration_hash": calibration_hash, "batch_size": 8, "steps": 10,
            "predicted_s": None if predicted_ms is None else predicted_ms / 1e3, "measured_s": measured_ms / 1e3,
            "spread_s": 0.5e-3, "host": "here"}


def test_the_measured_error_is_the_median_over_this_snapshot_and_calibration_only(tag_home):
    here = TOPOLOGY.content_hash()
    with store.connect() as conn:
        for predicted, measured in ((11.0, 10.0), (7.0, 10.0), (12.0, 10.0)):  # +10%, -30%, +20%
            store.save_measured_step(conn, _row(predicted, measured, here, None))
            assert (measured_error(conn, TOPOLOGY, None) is None) is (predicted != 12.0)  # fewer than 3: none
        store.save_measured_step(conn, _row(30.0, 10.0, "another-snapshot", None))
        store.save_measured_step(conn, _row(30.0, 10.0, here, "abc"))  # made under a calibration
        store.save_measured_step(conn, _row(None, 10.0, here, None))  # no prediction
        error = measured_error(conn, TOPOLOGY, None)
        assert measured_error(conn, TOPOLOGY, "abc") is None
    assert error == MeasuredError(pytest.approx(0.2), 3, None)
    assert "median |error| 20% over 3 measured steps (the default cost model)" in error.describe()


def test_a_distributed_plan_must_beat_one_device_by_more_than_the_measured_error():
    g = train_graph(layers=2)
    prof = profiles(g, "V100-32GB", per_sample_us=100.0, constant_us=20.0)

    def planned(error: MeasuredError | None):
        return plan(g, TOPOLOGY, prof, budget=Budget(iterations=20), num_groups=4, sfb=False, measured_error=error)

    free = planned(None)
    sim = Simulator(g, TOPOLOGY, prof)
    alone = sim.run(single(sim)).iteration_time_s
    gain = 1 - free.time_s / alone
    assert free.strategy.name != "single" and gain > 0.05
    # Both predictions may be off by the error m, in opposite directions: the plan must gain 2m / (1 + m).
    threshold = gain / (2 - gain)  # the error at which that is the plan's gain
    kept = planned(MeasuredError(threshold * 0.95, 5, None))  # the gain outlasts the error: the same plan
    assert kept.strategy.to_dict() == free.strategy.to_dict() and "one_device" not in kept.to_dict()
    assert kept.to_dict()["calibration"]["measured_error"] == {"median_abs_error": threshold * 0.95, "steps": 5,
                                                                "calibration_hash": None}
    assert threshold * 1.05 < gain  # the next plan beats one device by more than the error alone, yet ...
    dropped = planned(MeasuredError(threshold * 1.05, 5, None)).to_dict()  # ... the error could take it: one device
    assert dropped["strategy"]["name"] == "single"
    assert dropped["tag"]["iteration_time_s"] == pytest.approx(alone)
    assert f"the best is {gain:.0%} faster, within what the cost model's measured error on this topology, median " \
           f"|error| {threshold * 1.05:.0%} over 5 measured steps" in dropped["one_device"]["why"]
