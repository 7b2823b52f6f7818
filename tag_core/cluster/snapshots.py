"""Files in a watched directory: topology snapshots (TAG_TOPOLOGY_DIR) and calibrations
(TAG_CALIBRATION_DIR, files that `tag calibrate --export` writes): which are ready, and why the others are not.

A file is `<name>.json` directly inside the directory; `<name>` is its topology. It is ready when it
is a regular file (no symlinks, nothing resolving outside the directory), has
not changed for `settle_s` seconds (a file caught mid-copy is still changing),
and validates. The sensors act on ready files only. A topology may instead be a folder `<name>.probes/` of
`tag topology probe` files, one a machine: its snapshot is what `tag topology discover` makes of them, and it
settles when none of them has changed for `settle_s`.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tag_core.errors import TagInputError

from .calibration import Calibration
from .calibration_json import read_calibration_file
from .topology import Topology
from .topology_json import parse_topology, topology_from_json

DEFAULT_SETTLE_S = 3.0


def topology_directory() -> Path:
    return Path(os.environ.get("TAG_TOPOLOGY_DIR", "topologies"))


def calibration_directory() -> Path:
    return Path(os.environ.get("TAG_CALIBRATION_DIR", "calibrations"))


@dataclass(frozen=True)
class SnapshotScan:
    name: str  # the file stem: the `topology` partition key
    path: Path
    status: str  # "ready", "settling", "invalid" or "refused"
    reason: str = ""
    content_hash: str | None = None
    topology: Topology | None = None
    calibration: Calibration | None = None


PROBE_FOLDER = ".probes"


def scan_snapshots(directory: str | Path, settle_s: float = DEFAULT_SETTLE_S, now: float | None = None) -> list[SnapshotScan]:
    """Topology snapshots (files and probe folders); a ready one carries its Topology and content hash."""
    return _scan(directory, settle_s, now, _topology, probe_folders=True)


def snapshot_source(directory: Path, key: str) -> Path:
    """Where topology `key` comes from: `<key>.json`, else a probe folder `<key>.probes` (which may not exist)."""
    folder = directory / f"{key}{PROBE_FOLDER}"
    return folder if folder.is_dir() and not (directory / f"{key}.json").exists() else directory / f"{key}.json"


def load_snapshot(path: Path, key: str) -> Topology:
    """The topology a snapshot file holds, or that a probe folder's probes make (named `key`)."""
    if path.is_dir():
        from .probe.discover import probes_topology

        return probes_topology(path, key)
    from .topology_json import load_topology

    return load_topology(path)


def scan_calibrations(directory: str | Path, settle_s: float = DEFAULT_SETTLE_S,
                      now: float | None = None) -> list[SnapshotScan]:
    """Calibration files; a ready one carries its Calibration, and its calibration hash as content hash."""
    return _scan(directory, settle_s, now, _calibration)


def _topology(data: bytes, source: str) -> dict[str, Any]:
    topology = topology_from_json(data, source)
    return {"content_hash": topology.content_hash(), "topology": topology}


def _calibration(data: bytes, source: str) -> dict[str, Any]:
    calibration = read_calibration_file(source, "calibration")
    return {"content_hash": calibration.calibration_hash, "calibration": calibration}


def _scan(directory: str | Path, settle_s: float, now: float | None,
          load: Callable[[bytes, str], dict[str, Any]], probe_folders: bool = False) -> list[SnapshotScan]:
    directory = Path(directory)
    if not directory.is_dir():
        return []
    root = directory.resolve()
    now = time.time() if now is None else now
    scans = []
    files = {path.stem for path in directory.glob("*.json")}
    for path in sorted(directory.iterdir()):
        if path.name.startswith("."):
            continue  # editors' and copiers' temporary files start with a dot
        if path.suffix == ".json":
            scans.append(_scan_one(path, root, settle_s, now, load))
        elif probe_folders and path.suffix == PROBE_FOLDER and path.stem not in files:  # a file wins
            scans.append(_scan_probes(path, root, settle_s, now))
    return scans


def _scan_probes(folder: Path, root: Path, settle_s: float, now: float) -> SnapshotScan:
    name = folder.stem
    if folder.is_symlink() or folder.resolve().parent != root or not folder.is_dir():
        return SnapshotScan(name, folder, "refused", "a probe folder must be a real folder in the watched directory")
    try:
        changed = max([folder.stat().st_mtime] + [p.stat().st_mtime for p in folder.glob("*.json")])
    except OSError as exc:
        return SnapshotScan(name, folder, "invalid", f"unreadable: {exc}")
    if now - changed < settle_s:
        return SnapshotScan(name, folder, "settling", f"changed {now - changed:.1f}s ago; waiting {settle_s:g}s")
    try:
        topology = load_snapshot(folder, name)
    except TagInputError as exc:
        return SnapshotScan(name, folder, "invalid", str(exc))
    return SnapshotScan(name, folder, "ready", "", content_hash=topology.content_hash(), topology=topology)


def _scan_one(path: Path, root: Path, settle_s: float, now: float,
              load: Callable[[bytes, str], dict[str, Any]]) -> SnapshotScan:
    name = path.stem
    if path.is_symlink() or path.resolve().parent != root:
        return SnapshotScan(name, path, "refused", "a symlink or a path outside the watched directory")
    if not path.is_file():
        return SnapshotScan(name, path, "refused", "not a regular file")
    try:
        stat = path.stat()
        data = path.read_bytes()
    except OSError as exc:
        return SnapshotScan(name, path, "invalid", f"unreadable: {exc}")
    if now - stat.st_mtime < settle_s:
        return SnapshotScan(name, path, "settling", f"changed {now - stat.st_mtime:.1f}s ago; waiting {settle_s:g}s")
    try:
        loaded = load(data, str(path))
    except TagInputError as exc:
        return SnapshotScan(name, path, "invalid", str(exc))
    return SnapshotScan(name, path, "ready", "", **loaded)


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def recorded_topology(conn, key: str) -> Topology:
    """The latest snapshot recorded in the store for topology `key` (TagInputError when there is none)."""
    from tag_core import store

    snapshot = store.latest_topology_snapshot(conn, key)
    if snapshot is None:
        raise TagInputError("topology", f"{key!r} has no recorded snapshot; materialize cluster_topology")
    return parse_topology(snapshot["snapshot"], source=key)
