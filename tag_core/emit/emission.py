"""`Emission`: an emitted distributed step with everything it was made from, before it is written."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tag_core.capture.graph import OpGraph
from tag_core.capture.models.spec import ModelSpec
from tag_core.capture.trace import TracedStep
from tag_core.cluster.topology import Topology
from tag_core.simulate.strategy import Strategy

from .graph import EmittedGraph
from .place import OpPlacements, device_names


@dataclass
class Emission:
    spec: ModelSpec
    topology: Topology
    strategy: Strategy
    device_kind: str
    batch_size: int
    graph: OpGraph
    placed: OpPlacements
    emitted: EmittedGraph
    reference: TracedStep  # the single-device step at the same batch
    traces: dict[int, TracedStep]  # the step at every batch size the copies use
    initial_values: dict[str, np.ndarray]
    lineage: dict[str, Any]
    seconds: float
    notes: list[str] = field(default_factory=list)
    fusion: dict[str, Any] | None = None  # what `fusion.mark_emitted_for_xla` marked, when a fusion plan was applied

    @property
    def devices(self) -> list[str]:
        return device_names(self.topology, self.device_kind)

    def summary(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for p in self.placed.placements:
            kinds[p.kind] = kinds.get(p.kind, 0) + 1
        return {
            "model": self.spec.name,
            "topology": self.topology.name,
            "strategy": self.strategy.name or "plan",
            "device_kind": self.device_kind,
            "batch_size": self.batch_size,
            "single_device_ops": len(self.reference.graph_def.node),
            "emitted_ops": len(self.emitted.graph_def.node),
            "collectives": len(self.emitted.collectives),
            "placements": kinds,
            "emit_seconds": round(self.seconds, 3),
            **({"fusion": self.fusion} if self.fusion is not None else {}),
        }
