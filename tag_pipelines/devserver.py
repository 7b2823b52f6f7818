"""Start and stop `dagster dev` (webserver + daemon) for the demo, benchmarks and end-to-end test.

`dagster dev` started in the background ignores SIGTERM unless SIGINT is reset
to its default before exec; it then runs in its own process group, and one
signal to the group stops the webserver, the daemon and the code server.

The webserver is unauthenticated and launches runs: it binds loopback (HOST)
only, named explicitly rather than left to dagster's default. The code server
listens on a Unix socket of its own and the daemon on nothing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def prepare_dagster_home(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "deploy" / "dagster.yaml", path / "dagster.yaml")
    return path


@dataclass
class DagsterDev:
    process: subprocess.Popen
    port: int
    log: Path

    def stop(self, timeout_s: float = 60) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def start_dagster_dev(env: dict[str, str], log: Path, port: int | None = None) -> DagsterDev:
    """`dagster dev -w workspace.yaml` on 127.0.0.1 (HOST) with the given environment (DAGSTER_HOME, TAG_*)."""
    port = port or free_port()
    dagster = Path(sys.executable).with_name("dagster")

    def restore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    handle = open(log, "w")
    process = subprocess.Popen(
        [str(dagster), "dev", "-w", "workspace.yaml", "-h", HOST, "-p", str(port)],
        cwd=ROOT,
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
        preexec_fn=restore_sigint,
        start_new_session=True,
    )
    return DagsterDev(process, port, log)


def wait_for(predicate, timeout_s: float, every_s: float = 2.0, server: DagsterDev | None = None):
    """Poll `predicate` until it returns something truthy; None after the timeout or if the server died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if server is not None and server.process.poll() is not None:
            return None
        time.sleep(every_s)
    return None
