"""Noticing that a local TF server process died, and saying so in one line.

TF does not always end a step whose peer is gone: a collective or a Recv from a dead task can wait for its
whole timeout (a measurement of many graphs ran 44 minutes so). The parent of a local run holds each server's
process, so it polls them (`ServerWatch.death`) while it follows its client and stops the client as soon as
one has exited. The line names the task, its process, how it ended (exit code or signal), its resident memory
when last seen and the machine's memory then (an OOM kill is a SIGKILL whose memory was large), and the end
of its stderr when that says more.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Sequence


DEATH_GRACE_S = 2.0  # how long a step's error waits for a server's exit to show, before it counts as the step's own


@dataclass
class _Seen:
    rss_bytes: int = 0  # the server's resident memory when last seen alive
    available_bytes: int | None = None  # the machine's MemAvailable then


@dataclass
class ServerWatch:
    """The server processes of a local run (`tag_core.runtime.local_cluster.ServerProcess`, with their Popen
    and stderr tail); `death()` is None while all run."""

    servers: Sequence
    seen: dict[int, _Seen] = field(default_factory=dict)

    def death(self) -> str | None:
        for server in self.servers:
            ended = _ended(server)
            if ended is not None:
                return self._line(server, ended)
            self.seen[server.task] = _Seen(_rss_bytes(server.pid), _available_bytes())
        return None

    def _line(self, server, ended: str) -> str:
        line = f"the TF server of task {server.task} (process {server.pid}, {server.address}) died: {ended}"
        seen = self.seen.get(server.task)
        if seen is not None and seen.rss_bytes:
            line += f"; it held {seen.rss_bytes / 2**30:.1f} GiB when last seen"
            if seen.available_bytes is not None:
                line += f", with {seen.available_bytes / 2**30:.1f} GiB of the machine's memory available"
        tail = getattr(server, "stderr", None)
        if tail:
            from .run_result import one_line_tail

            told = one_line_tail(list(tail), last=3, limit=800)
            if told != "no output":
                line += f"; its stderr: {told[-300:]}"
        return line


def death_within(watch: ServerWatch, seconds: float = DEATH_GRACE_S) -> str | None:
    """`watch.death()`, waiting up to `seconds` for one: a lost peer's error can come before its exit is seen."""
    end = time.monotonic() + seconds
    while True:
        died = watch.death()
        if died is not None or time.monotonic() >= end:
            return died
        time.sleep(0.1)


def _ended(server) -> str | None:
    """How the server's process ended, or None while it runs."""
    process: subprocess.Popen | None = getattr(server, "process", None)
    if process is not None:
        code = process.poll()
        if code is None:
            return None
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with code {code}"
    try:  # only its pid is known (not this process's child): gone or a zombie
        os.kill(server.pid, 0)
        with open(f"/proc/{server.pid}/stat") as stat:
            return "exited" if stat.read().rsplit(")", 1)[-1].split()[0] == "Z" else None
    except (ProcessLookupError, FileNotFoundError):
        return "exited"
    except PermissionError:
        return None


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
