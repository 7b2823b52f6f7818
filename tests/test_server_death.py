"""A local TF server that dies mid-measurement: the run ends within a bounded time, with one line naming the task,
and what was measured before stands. Real servers, really killed (SIGKILL), no mocks."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from child_processes import started_by

from tag_core.capture import resolve_model
from tag_core.cluster import parse_topology
from tag_core.emit import emit, write_emission
from tag_core.runtime.interleave import measure_interleaved
from tag_core.runtime.local_cluster import pinnable_cores
from tag_core.runtime.supervisor import run_emitted

MLP = "mlp[features=12,hidden=16]"
BATCH = 8
LOCAL2 = {"name": "local-2", "inter_gbps": 5.0,
          "machines": [{"name": f"task{k}", "gpu": "cpu", "count": 1, "intra_gbps": 5.0} for k in range(2)]}
BOUND_S = 30.0  # from the kill to the end: the servers are polled each second, a step's error waits 2 s for it
pytestmark = [pytest.mark.skipif(len(pinnable_cores()) < 2, reason="pinned tasks need a core each"),
              pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("server_death")
    spec, topology = resolve_model(MLP, BATCH), parse_topology(LOCAL2)
    return [write_emission(emit(spec, topology, strategy, "cpu"), root / strategy) for strategy in ("allreduce", "ps")]


def _server_of_task(task: int) -> int:
    """The pid of the process this test started that serves `task` (tag_core.runtime.local_cluster)."""
    for pid, words in started_by("tag_core.runtime.local_cluster"):
        if "--task-index" in words and words[words.index("--task-index") + 1] == str(task):
            return pid
    raise AssertionError(f"no server of task {task} among this process's descendants")


class Killer:
    """An echo that SIGKILLs task 1's server when `when` says so, and notes the time."""

    def __init__(self, when):
        self.when, self.killed_at, self.pid, self.lines = when, None, None, []

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if self.killed_at is None and self.when(line):
            self.pid = _server_of_task(1)
            os.kill(self.pid, signal.SIGKILL)
            self.killed_at = time.monotonic()


@pytest.mark.slow
def test_a_server_killed_mid_measurement_ends_it_naming_the_task_and_keeps_the_steps_timed(folders):
    killer = Killer(lambda line: line.startswith("round 2 of"))
    steps, rounds = 400, 4  # far more than can run before the bound: only the death ends it early
    outcomes = measure_interleaved(folders, steps, warmup=1, rounds=rounds, timeout=600, echo=killer)
    ended = time.monotonic()
    assert killer.killed_at is not None, killer.lines
    assert ended - killer.killed_at < BOUND_S
    message = outcomes[0].stopped
    assert message is not None and "\n" not in message
    assert f"task 1 (process {killer.pid}," in message and "SIGKILL" in message
    assert killer.lines[-1] == message  # said once, as the measurement's last line
    for outcome in outcomes:  # round 1 was timed in full for each graph, and stands
        assert outcome.error is None and outcome.stopped == message
        assert outcome.timing is not None and steps // rounds <= outcome.timing.steps < steps
        # Round 1 ran the graphs in order, so every step of round 1 knows its graph's place in it.
        assert len(outcome.positions) == len(outcome.seconds)
        assert set(outcome.positions[:steps // rounds]) == {outcomes.index(outcome)}


@pytest.mark.slow
def test_a_server_killed_mid_run_ends_tag_run_naming_the_task(folders):
    killer = Killer(lambda line: line.startswith("step 0:"))
    result = run_emitted(folders[0], steps=100_000, timeout=600, echo=killer)
    ended = time.monotonic()
    assert killer.killed_at is not None, killer.lines
    assert ended - killer.killed_at < BOUND_S
    assert not result.ok and "\n" not in result.error
    assert f"task 1 (process {killer.pid}," in result.error and "SIGKILL" in result.error
    assert result.steps and result.lines[-1] == result.error  # the steps run before are kept
