"""The client's part of a calibrated step: its launch, its feed, and the rows a fed task sends on."""

from __future__ import annotations

from dataclasses import replace

import pytest
from simgraphs import BATCH, calibration, profiles, topology, train_graph

from tag_core.cluster.calibration import Fit, Sample
from tag_core.simulate import CommModel, Simulator, Strategy
from tag_core.simulate.cost import bytes_per_s, transfer_time

V100 = "V100-32GB"
INPUT_BYTES = 4 * BATCH * 256  # train_graph's input


def _two_machines():
    return topology(("a", V100, 1, 100.0), ("b", V100, 1, 100.0), inter_gbps=25.0)


def _on(g, option: str, mask=(True, True)) -> Strategy:
    return Strategy.uniform(len(g.ops), 2, 2, option, mask=list(mask))


def test_a_step_launches_on_the_tasks_it_touches_and_rows_cross_from_the_fed_task():
    g, topo = train_graph(layers=1), _two_machines()
    steps = [Sample("step", None, tasks, None, run, seconds) for tasks, seconds in ((1, 5e-4), (2, 2e-3))
             for run in range(3)]
    comm = CommModel.from_calibration(calibration(topo, samples=steps))
    on_a, on_b, on_both = (_on(g, "allreduce", mask) for mask in ((True, False), (False, True), (True, True)))
    plain = Simulator(g, topo, profiles(g, V100))
    calibrated = Simulator(g, topo, profiles(g, V100), comm=comm)
    # The session's master is the client's own: a step on b alone launches on b alone, fed there directly.
    assert calibrated.run(on_a).iteration_time_s - plain.run(on_a).iteration_time_s == pytest.approx(5e-4)
    assert calibrated.run(on_b).iteration_time_s - plain.run(on_b).iteration_time_s == pytest.approx(5e-4)
    # On both, the input is fed to a's task and b's half of its rows crosses before b can start.
    unfed = Simulator(g, topo, profiles(g, V100), comm=replace(comm, client_feeds=False))
    assert calibrated.run(on_both).iteration_time_s - unfed.run(on_both).iteration_time_s == pytest.approx(
        transfer_time(INPUT_BYTES / 2, 7.8, 9e-4), rel=1e-6)
    # Without a calibration the paper's setting holds: each worker reads its own data, launching is free.
    assert plain.run(on_b).iteration_time_s == pytest.approx(plain.run(on_a).iteration_time_s)

def test_a_measured_feed_from_the_client_is_charged_for_the_whole_batch():
    g, topo = train_graph(layers=1), _two_machines()
    feed = Fit(latency_s=1e-4, gbps=2.0, residual_rms_s=0.0, residual_max_rel=0.0, samples=10)
    plain = CommModel.from_calibration(calibration(topo))
    measured = replace(plain, feed_fit=feed)
    on_a = _on(g, "allreduce", (True, False))
    extra = (Simulator(g, topo, profiles(g, V100), comm=measured).run(on_a).iteration_time_s
             - Simulator(g, topo, profiles(g, V100), comm=plain).run(on_a).iteration_time_s)
    assert extra == pytest.approx(1e-4 + INPUT_BYTES / bytes_per_s(2.0))

def test_a_duplicated_input_comes_to_each_machine_from_the_client_and_waits_for_no_sender():
    g, topo = train_graph(layers=1), _two_machines()
    feed = Fit(latency_s=1e-4, gbps=2.0, residual_rms_s=0.0, residual_max_rel=0.0, samples=10)
    comm = replace(CommModel.from_calibration(calibration(topo)), feed_fit=feed)
    both = _on(g, "duplicate")
    for hold in (0.0, 5e-3):  # TF's master feeds from the client's device: no task slices and sends it on
        busy = replace(comm, busy_send_s=hold)
        extra = (Simulator(g, topo, profiles(g, V100), comm=busy).run(both).iteration_time_s
                 - Simulator(g, topo, profiles(g, V100), comm=replace(busy, client_feeds=False)).run(both)
                 .iteration_time_s)
        assert extra == pytest.approx(1e-4 + 2 * INPUT_BYTES / bytes_per_s(2.0)), hold


def test_rows_sent_on_wait_for_the_fed_tasks_compute_at_most_and_the_schedules_transfers_not_again():
    g, topo = train_graph(layers=2), _two_machines()
    comm = CommModel.from_calibration(calibration(topo))
    strategy = _on(g, "ps")  # b's rows and a's weights leave a together: b asked for both as its step began
    idle = Simulator(g, topo, profiles(g, V100), comm=comm).run(strategy)
    for hold, waited in ((1e-5, 1e-5), (1.0, idle.busy_s[0])):  # a's compute lets them go, at the latest when it ends
        busy = Simulator(g, topo, profiles(g, V100), comm=replace(comm, busy_send_s=hold)).run(strategy)
        assert busy.iteration_time_s - idle.iteration_time_s == pytest.approx(waited, rel=1e-9), hold
    # Unfed, nothing came before the schedule: its pulls wait while a computes.
    unfed = replace(comm, client_feeds=False)
    plain, held = (Simulator(g, topo, profiles(g, V100), comm=replace(unfed, busy_send_s=hold)).run(strategy)
                   for hold in (0.0, 1.0))
    assert held.iteration_time_s > plain.iteration_time_s
