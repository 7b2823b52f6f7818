"""Stage 5, emission: `distributed_graph`, each model × topology's latest plan as a distributed TF graph,
and its check `graph_matches_single_device` (checks.py)."""

from .assets import distributed_graph, graph_folder
from .checks import CHECK, GRAPH_CHECK
from .config import EmitConfig

__all__ = ["CHECK", "GRAPH_CHECK", "EmitConfig", "distributed_graph", "graph_folder"]
