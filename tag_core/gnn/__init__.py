"""The heterogeneous GNN that gives MCTS its priors.

In: planning problems (op groups, a topology, a simulator: `tag_core.plan`), or a checkpoint file.
Out: a checkpoint (torch state dict, loaded with `weights_only=True`) and a prior for `tag_core.search`'s
MCTS: a probability for every (mask, option) action of every op group.

- `compat`: the one place dgl is imported (see DESIGN.md for why it needs care);
- `features`: (op groups, topology, strategy, SimResult) -> `GraphSample`;
- `model`: heterogeneous edge-feature GAT scoring every (mask, option) action;
- `checkpoint`: save/load (torch state dicts, `weights_only=True`) with metadata;
- `prior`: the MCTS prior hook built from a checkpoint, and how `tag plan` picks one;
- `train`: AlphaZero-style training on MCTS visit counts (`tag train-gnn`).

Importing this package does not import dgl or torch; the modules do.
"""
