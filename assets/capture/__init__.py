"""Stage 1, capture: `training_graph`, each model's training step as an OpGraph in the store."""

from .assets import training_graph

__all__ = ["training_graph"]
