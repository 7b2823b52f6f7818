"""The collectives' own timeout: set for short runs (a missing peer is named, tests/test_runtime.py), off where
TF's two watchdog threads per collective run, each sleeping out the timeout, would pile up in the servers until
one cannot start a thread and aborts (DenseNet121 in `tag fidelity`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from child_processes import started_by

from tag_core.capture import resolve_model
from tag_core.cluster import parse_topology
from tag_core.emit import emit, write_emission
from tag_core.runtime.collective_timeout import SHARE, WATCHDOGS_PER_RUN, collective_timeout_s, thread_limit
from tag_core.runtime.local_cluster import pinnable_cores
from tag_core.runtime.supervisor import run_emitted

LOCAL2 = {"name": "local-2", "inter_gbps": 5.0,
          "machines": [{"name": f"task{k}", "gpu": "cpu", "count": 1, "intra_gbps": 5.0} for k in range(2)]}


def test_the_timeout_is_set_only_where_its_threads_fit_the_machine():
    budget = SHARE * thread_limit()
    assert budget > 0
    meta = {"collectives": [{}] * 606}
    fits = int(budget // (WATCHDOGS_PER_RUN * 606))
    assert collective_timeout_s(meta, 100.0, fits) == 80.0
    assert collective_timeout_s(meta, 100.0, fits + 1) == 0.0
    assert collective_timeout_s(meta, 100.0, fits // 2, share=0.5) == 80.0  # two graphs share the servers
    assert collective_timeout_s(meta, 100.0, fits, share=0.5) == 0.0
    assert collective_timeout_s(meta, 100.0, None) == 0.0  # an unbounded run: never
    assert collective_timeout_s({"collectives": []}, 100.0, 10**9) == 0.0


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Threads:")).split()[1])


def _server_pids() -> list[int]:
    return [pid for pid, _ in started_by("tag_core.runtime.local_cluster")]


@pytest.mark.skipif(len(pinnable_cores()) < 2, reason="pinned tasks need a core each")
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_long_run_does_not_grow_the_servers_threads(tmp_path):
    emission = emit(resolve_model("mlp[features=12,hidden=16]", 8), parse_topology(LOCAL2), "allreduce", "cpu")
    folder = write_emission(emission, tmp_path / "emitted")
    collectives = len(json.loads((folder / "plan.json").read_text())["emission"]["collectives"])
    assert collectives
    steps = 2 + int(SHARE * thread_limit()) // (WATCHDOGS_PER_RUN * collectives)  # past the budget
    seen: dict[int, list[int]] = {}

    def echo(line: str) -> None:
        if line.startswith(("step 1:", f"step {steps - 1}:")):
            for pid in _server_pids():
                seen.setdefault(pid, []).append(_threads(pid))

    result = run_emitted(folder, steps=steps, timeout=600, echo=echo)
    assert result.ok, result.error
    assert len(seen) == 2 and all(len(counts) == 2 for counts in seen.values())
    per_step = WATCHDOGS_PER_RUN * collectives
    assert all(last - first < per_step for first, last in seen.values())  # not even one step's watchdogs stayed
