"""The cluster: machines of identical GPUs and the links between them.

In: a topology snapshot (JSON: machines, GPU types by catalog name or inline, bandwidths), or a seed;
samples measured on a runtime, or a calibration file.
Out: a validated `Topology` (devices in machine-major order, bandwidth matrices, a content hash; racks,
pods and their uplinks in `hierarchy.py`, per-level queries vectorised over machine pairs);
the GPU catalog (`GpuType`: peak FLOP/s, memory, memory bandwidth); snapshots found in a folder;
a `Calibration` (`calibration.py`: latency + bandwidth fits per link class and collective, fixed
overheads, its samples; as JSON in `calibration_json.py`).
"""

from .gpu_catalog import CATALOG, GpuType, lookup_gpu, normalise_device_name
from .hierarchy import Hierarchy, Rack, Uplink
from .random_cluster import sized_topology
from .snapshots import (
    DEFAULT_SETTLE_S,
    SnapshotScan,
    calibration_directory,
    load_snapshot,
    recorded_topology,
    scan_calibrations,
    scan_snapshots,
    snapshot_source,
    topology_directory,
)
from .topology import Device, Machine, Topology, random_topology
from .topology_json import load_topology, parse_topology, topology_from_json

__all__ = [
    "CATALOG", "DEFAULT_SETTLE_S", "Device", "GpuType", "Hierarchy", "Machine", "Rack", "SnapshotScan", "Topology",
    "Uplink", "calibration_directory", "load_snapshot", "snapshot_source", "load_topology", "lookup_gpu", "normalise_device_name", "parse_topology",
    "random_topology", "recorded_topology", "scan_calibrations", "scan_snapshots", "sized_topology",
    "topology_directory", "topology_from_json",
]
