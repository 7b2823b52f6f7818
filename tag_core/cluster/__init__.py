"""The cluster: machines of identical GPUs and the links between them.

In: a topology snapshot (JSON: machines, GPU types by catalog name or inline, bandwidths), or a seed;
samples measured on a runtime, or a calibration file.
Out: a validated `Topology` (devices in machine-major order, bandwidth matrices, a content hash);
the GPU catalog (`GpuType`: peak FLOP/s, memory, memory bandwidth); snapshots found in a folder;
a `Calibration` (`calibration.py`: latency + bandwidth fits per link class and collective, fixed
overheads, its samples; as JSON in `calibration_json.py`).
"""

from .gpu_catalog import CATALOG, GpuType, lookup_gpu, normalise_device_name
from .snapshots import (
    DEFAULT_SETTLE_S,
    SnapshotScan,
    calibration_directory,
    recorded_topology,
    scan_calibrations,
    scan_snapshots,
    topology_directory,
)
from .topology import Device, Machine, Topology, random_topology
from .topology_json import load_topology, parse_topology, topology_from_json

__all__ = [
    "CATALOG", "DEFAULT_SETTLE_S", "Device", "GpuType", "Machine", "SnapshotScan", "Topology",
    "calibration_directory", "load_topology", "lookup_gpu", "normalise_device_name", "parse_topology", "random_topology",
    "recorded_topology", "scan_calibrations", "scan_snapshots", "topology_directory", "topology_from_json",
]
