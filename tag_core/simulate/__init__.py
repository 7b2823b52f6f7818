"""The virtual runtime: one training iteration of a strategy on a cluster, simulated.

In: an `OpGraph`, a `Topology`, op profiles and a `Strategy` (per op group: a device mask and one of
allreduce, ps, duplicate, model_parallel; batch shares). The `Strategy` contract lives here because
the simulator is its first reader; the search stages produce strategies.
Out: a `SimResult`: iteration time, per-device memory and out-of-memory flags, busy and idle time,
communication totals, and a timeline (PNG/SVG/PDF/JSON via `save_timeline`).
"""

from .comm import CommModel
from .cost import ComputeModel
from .result import SimResult, Timeline
from .simulator import Simulator, simulate
from .strategy import OPTIONS, Strategy
from .timeline import check_timeline_path, save_timeline, timeline_formats

__all__ = [
    "CommModel", "ComputeModel", "OPTIONS", "SimResult", "Simulator", "Strategy", "Timeline",
    "check_timeline_path", "save_timeline", "simulate", "timeline_formats",
]
