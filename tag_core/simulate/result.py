"""`SimResult`: what one simulated iteration gives back, and its `Timeline` for Gantt charts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tag_core.cluster.topology import Topology


@dataclass
class Timeline:
    """Flat arrays for a Gantt chart; one row per (device, interval)."""

    compute_device: np.ndarray
    compute_op: np.ndarray
    compute_start: np.ndarray
    compute_end: np.ndarray
    comm_device: np.ndarray
    comm_kind: np.ndarray  # index into units.KINDS
    comm_start: np.ndarray
    comm_end: np.ndarray


@dataclass
class SimResult:
    iteration_time_s: float
    oom: bool
    device_oom: np.ndarray  # bool per device
    peak_memory_bytes: np.ndarray  # per device
    memory_capacity_bytes: np.ndarray  # per device
    busy_s: np.ndarray  # per device: compute time
    idle_s: np.ndarray  # per device: iteration time - busy
    op_start_s: np.ndarray  # per op: earliest start over its replicas
    op_end_s: np.ndarray  # per op: latest end over its replicas
    op_idle_after_s: np.ndarray  # per op: longest gap after it on any device running it
    group_makespan_s: np.ndarray  # per group: last end - first start of its ops
    group_idle_after_s: np.ndarray  # per group: sum of its ops' idle-after
    comm_s: dict[str, float]  # seconds of communication by kind
    simulated_slots: int  # devices actually simulated (interchangeable devices share one)
    timeline: Timeline | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, topology: Topology | None = None) -> dict[str, Any]:
        names = [f"{topology.machines[d.machine].name}:{d.local}" for d in topology.devices] if topology else None
        per_device = lambda a: dict(zip(names, np.asarray(a).tolist())) if names else np.asarray(a).tolist()  # noqa: E731
        return {
            "iteration_time_s": self.iteration_time_s,
            "oom": self.oom,
            "oom_devices": [n for n, o in zip(names or range(len(self.device_oom)), self.device_oom.tolist()) if o],
            "peak_memory_bytes": per_device(self.peak_memory_bytes.astype(np.int64)),
            "memory_capacity_bytes": per_device(self.memory_capacity_bytes.astype(np.int64)),
            "busy_s": per_device(self.busy_s),
            "idle_s": per_device(self.idle_s),
            "comm_s": dict(self.comm_s),
            "group_makespan_s": self.group_makespan_s.tolist(),
            "group_idle_after_s": self.group_idle_after_s.tolist(),
            "simulated_slots": self.simulated_slots,
        }
