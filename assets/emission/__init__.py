"""Stage 5, emission: `distributed_graph`, each model × topology's latest plan as a distributed TF graph."""

from .assets import CHECK, EmitConfig, distributed_graph, graph_folder

__all__ = ["CHECK", "EmitConfig", "distributed_graph", "graph_folder"]
