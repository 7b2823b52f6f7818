"""The emitter: a plan becomes a distributed TF training graph.

In: a `ModelSpec`, a `Topology` and a `Strategy` or plan file (`tag_core.plan`), optionally a fusion plan.
Out: an `Emission` and its folder: graph.pb, cluster.json (a TF ClusterSpec), plan.json with what
`tag run` needs, a README, and the single-device step for `tag run --check`.
"""

from .emission import Emission
from .emitter import (
    DEVICE_KINDS,
    check_lineage,
    emit,
    emit_folder,
    plan_strategy,
    plan_topology,
    read_plan,
    resolve_strategy,
)
from .folder import write_emission
from .prediction import emit_predicted, predict_emission

__all__ = [
    "DEVICE_KINDS", "Emission", "check_lineage", "emit", "emit_folder", "emit_predicted", "plan_strategy",
    "plan_topology", "predict_emission", "read_plan", "resolve_strategy", "write_emission",
]
