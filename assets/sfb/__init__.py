"""SFB: `sfb_decisions`, the gradients each model × topology's plan rebuilds from gathered factors."""

from .assets import sfb_decisions

__all__ = ["sfb_decisions"]
