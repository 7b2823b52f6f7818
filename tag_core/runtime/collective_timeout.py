"""The emitted collectives' own timeout, set only where TF's watchdog threads for it stay few.

With `timeout_seconds` > 0 a collective that waits for a peer that never comes fails naming itself. But TF
starts a thread for each execution of such an op, twice (its parameters, then its run:
base_collective_executor.cc, "TODO: Share the timeout watchdog thread among collectives"), and each thread
sleeps out the whole timeout, whether the op finished or not. Measured on DenseNet121 under dp-nccl on two
local tasks (606 collectives a task): +1212 threads a task per step, kept for 0.8 x the run's timeout. In
`tag fidelity` (8 graphs, a 24-minute timeout) the servers reached the machine's 32,768 pids, one aborted
(std::system_error: Resource temporarily unavailable) and every graph then failed with UnavailableError.

So the timeout is set only where every thread the run may start fits in a share of the machine's thread
limit. Elsewhere the session's deadline (RunOptions.timeout_in_ms) bounds a step, and the parent names a
server that died (tag_core.runtime.server_death).
"""

from __future__ import annotations

from pathlib import Path

WATCHDOGS_PER_RUN = 2  # threads TF starts per execution of a collective with a timeout
SHARE = 0.25  # of the machine's thread limit, for the watchdogs: TF's own pools and other processes need the rest
RUN_FRACTION = 0.8  # of the run's timeout: a missing peer fails the step naming the op before the session's deadline


def collective_timeout_s(meta: dict, timeout: float, runs: int | None, share: float = 1.0) -> float:
    """Seconds for every collective's `timeout_seconds` in a run of `runs` steps (None: unbounded), or 0 (none)
    where the watchdog threads could pile up; `share` of the budget when several graphs share the servers."""
    collectives = len(meta.get("collectives", []))  # all tasks': local tasks share this machine's threads
    if runs is None or collectives == 0:
        return 0.0
    if WATCHDOGS_PER_RUN * collectives * runs > SHARE * share * thread_limit():
        return 0.0
    return max(1.0, RUN_FRACTION * float(timeout))


def thread_limit() -> int:
    """The most threads this machine lets exist at once: the kernel's pid and thread limits and this process's
    cgroup's pids.max, whichever is lowest."""
    limits = [_number(Path("/proc/sys/kernel/pid_max")), _number(Path("/proc/sys/kernel/threads-max"))]
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":  # cgroup v2
                limits.append(_number(Path("/sys/fs/cgroup") / path.lstrip("/") / "pids.max"))
            elif "pids" in controllers.split(","):
                limits.append(_number(Path("/sys/fs/cgroup/pids") / path.lstrip("/") / "pids.max"))
    except (OSError, ValueError):
        pass
    known = [n for n in limits if n]
    return min(known) if known else 0  # unknown: no budget, so no collective timeout


def _number(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())  # "max" (no limit) is not a number
    except (OSError, ValueError):
        return None
