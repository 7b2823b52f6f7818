"""`tag calibrate --local N` and `--cluster`: measure, store the calibration, write the local topology; and
the cluster.json a real cluster's calibration reads."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tag_core.cluster.topology import Topology
from tag_core.errors import TagInputError

from .calibrate import CalibrationSettings, calibrate_cluster, calibrate_local


def calibrate_and_store(settings: CalibrationSettings, db: str | None, *, local: int | None = None,
                        name: str | None = None, topology: Topology | None = None,
                        cluster: dict[str, list[str]] | None = None, out: Path | None = None,
                        progress: bool = True):
    """Calibrate `local` pinned tasks (named `name`) or the tasks of `cluster` (`topology`'s), store the
    calibration and, with `out`, write the local topology there: (calibration, topology, wall seconds).
    CalibrationError or ServerStartError when the measurement fails; nothing is stored then."""
    from tag_core import store
    from tag_core.cluster.calibration import save_to_store
    from tag_core.files import write_atomically

    store.connect(db).close()  # a store that cannot be opened fails now, not after the measurements
    started = time.monotonic()
    if topology is None:
        calibration, topology = calibrate_local(local, settings, name=name, progress=progress)
    else:
        calibration = calibrate_cluster(topology, cluster, settings, progress=progress)
    wall = time.monotonic() - started
    conn = store.connect(db)  # one transaction first: the store is what may be busy; the file was checked
    try:
        save_to_store(conn, calibration)
    finally:
        conn.close()
    if out is not None:
        write_atomically(out, json.dumps(topology.to_dict(), indent=2) + "\n", make_parents=False)
    return calibration, topology, wall


def read_cluster_file(path: str, tasks: int) -> dict[str, list[str]]:
    """The "cluster" of a cluster.json as `tag emit` writes it: {"cluster": {"worker": ["host:port", ...]}}."""
    from tag_core.files import input_file, read_json

    data = read_json(input_file(path, "--cluster"), "--cluster")
    spec = data.get("cluster") if isinstance(data, dict) else None
    workers = spec.get("worker") if isinstance(spec, dict) else None
    if not (isinstance(workers, list) and all(isinstance(w, str) and ":" in w for w in workers)):
        raise TagInputError("--cluster", f'{path}: cluster.worker must be a list of "host:port" strings')
    if len(workers) != tasks:
        raise TagInputError("--cluster", f"{path} lists {len(workers)} workers; the topology has {tasks} "
                                         "machines (task K = machine K)")
    return {"worker": workers}
