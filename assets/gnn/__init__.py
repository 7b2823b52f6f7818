"""The GNN: `gnn_checkpoint`, the network that gives MCTS its priors, trained by hand."""

from .assets import GnnTrainConfig, gnn_checkpoint

__all__ = ["GnnTrainConfig", "gnn_checkpoint"]
