"""A calibration between the store and a JSON file (tag_core.cluster.calibration_json): `tag calibrate
--import` and `--export`. Errors are TagInputErrors naming the flag."""

from __future__ import annotations

from pathlib import Path

from tag_core.errors import TagInputError

from .calibration import Calibration, load_from_store, save_to_store
from .calibration_json import read_calibration_file, write_calibration_file


def import_calibration(path: str, db: str | None) -> tuple[Calibration, str | None]:
    """Store the calibration file at `path`: the calibration, and a note when the store's snapshot of its
    topology is another than the one it was measured for (None otherwise)."""
    from tag_core import store
    from tag_core.files import input_file

    calibration = read_calibration_file(input_file(path, "--import"), "--import")
    conn = store.connect(db)
    try:
        save_to_store(conn, calibration)
    finally:
        conn.close()
    conn = store.connect(db, read_only=True)
    try:
        snapshot = store.latest_topology_snapshot(conn, calibration.topology)
    finally:
        conn.close()
    if snapshot is None or snapshot["content_hash"] == calibration.topology_hash:
        return calibration, None
    return calibration, (f"the store's snapshot of {calibration.topology} is {snapshot['content_hash']}; this "
                         f"calibration was measured for {calibration.topology_hash}")


def export_calibration(path: str, db: str | None, topology: str | None = None) -> Calibration:
    """Write the newest stored calibration of `topology` (a name or a snapshot file; None: the only topology
    the store holds calibrations of) to `path`; the calibration written."""
    from tag_core import store

    name = topology
    if name is not None and name.endswith(".json") and Path(name).is_file():
        from .topology_json import load_topology

        name = load_topology(name).name
    conn = store.connect(db, read_only=True)
    try:
        known = sorted(set(store.list_calibrations(conn).topology))
        if name is None:
            if not known:
                raise TagInputError("--export", "the store holds no calibration; run `tag calibrate --local N` "
                                                "or --import one")
            if len(known) != 1:
                raise TagInputError("--topology", f"the store holds calibrations of {', '.join(known)}; name one")
            name = known[0]
        calibration = load_from_store(conn, topology=name)
    finally:
        conn.close()
    if calibration is None:
        raise TagInputError("--topology", f"no calibration of {name!r} is stored"
                            + (f"; stored: {', '.join(known)}" if known else ""))
    write_calibration_file(calibration, path)
    return calibration
