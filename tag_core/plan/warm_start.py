"""Warm starts: a previous plan's choices mapped onto new op groups and machines."""

from __future__ import annotations

import numpy as np

from tag_core.capture.graph import OpGraph
from tag_core.cluster.topology import Topology
from tag_core.search.grouping import OpGroups
from tag_core.search.mcts import ActionSpace
from tag_core.simulate.strategy import Strategy


def warm_start_problem(previous: dict | Strategy, graph: OpGraph, topology: Topology) -> str | None:
    """Why a previous plan cannot seed a search of `graph` on `topology`, or None when it maps."""
    if isinstance(previous, dict) and previous.get("model") not in (None, graph.model):
        return f"it was made for model {previous['model']!r}, not {graph.model!r}"
    previous = _warm_strategy(previous)
    if len(previous.op_groups) != len(graph.ops):
        return f"it has {len(previous.op_groups)} ops, {graph.model} has {len(graph.ops)}"
    old_names = [str(n).lower() for n in previous.extra.get("machines", [])]
    names = [m.name.lower() for m in topology.machines]
    if not old_names:
        if previous.masks.shape[1] != len(names):
            return (f"its masks cover {previous.masks.shape[1]} machines, {topology.name} has {len(names)}, "
                    f"and it does not name them (extra.machines)")
    elif len(old_names) != previous.masks.shape[1]:
        return f"extra.machines names {len(old_names)} machines but its masks cover {previous.masks.shape[1]}"
    elif not set(old_names) & set(names):
        return f"none of its machines ({', '.join(previous.extra['machines'])}) is in {topology.name}"
    return None


def _warm_strategy(previous: dict | Strategy) -> Strategy:
    if isinstance(previous, dict):
        # A plan JSON embeds its strategy (its own "groups" is a count, so unwrap it here).
        previous = Strategy.from_dict(previous["strategy"] if isinstance(previous.get("strategy"), dict) else previous)
    return previous


def warm_start_actions(previous: dict | Strategy, graph: OpGraph, topology: Topology, groups: OpGroups,
                  space: ActionSpace) -> np.ndarray | None:
    """A previous plan's choices mapped onto these groups and machines (None when they do not map:
    see `warm_start_problem`).

    Each new group takes the (mask, option) most of its ops had before; masks map by
    machine name, so a plan survives machines joining or leaving.
    """
    if warm_start_problem(previous, graph, topology) is not None:
        return None
    previous = _warm_strategy(previous)
    names = [m.name.lower() for m in topology.machines]
    old_names = [str(n).lower() for n in previous.extra.get("machines", [])] or names
    out = np.empty(groups.num_groups, dtype=np.int64)
    for g in range(groups.num_groups):
        old = np.bincount(previous.op_groups[groups.members(g)], minlength=previous.num_groups)
        og = int(np.argmax(old))
        kept = {n for n, on in zip(old_names, previous.masks[og]) if on}
        mask = np.array([n in kept for n in names], dtype=bool)
        if not mask.any():
            mask[:] = True
        out[g] = space.index(mask, previous.options[og])
    return out
