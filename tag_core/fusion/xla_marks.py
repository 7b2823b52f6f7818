"""A fusion plan applied to a step's GraphDef: each pattern one XLA cluster, each region one compiled call."""

from __future__ import annotations

import re

from tag_core.capture.graph import input_node

from .patterns import FusionPlan, pattern_scopes


def mark_for_xla(graph_def, plan: FusionPlan, fetches: list[str]) -> dict:
    """Mark each pattern's nodes (and constants only they read) as one XLA cluster, and compile each region as one
    must-compile function call (`region_calls.py`). `fetches`: the names the caller runs or fetches (`op` or
    `op:k`), which stay in the graph. Returns what was marked."""
    marked = _mark_scopes(graph_def, pattern_scopes(plan))
    return {"patterns": len(plan.patterns), "nodes_marked": marked, **_compile_regions(graph_def, plan.regions, fetches)}


def _compile_regions(graph_def, regions: list[list[str]], fetches: list[str]) -> dict:
    """Rewrite the regions' dense segment sums as gathers (`segment_sums.py`), then make each region a call."""
    from .region_calls import compile_as_calls
    from .segment_sums import rewrite_as_gathers

    regions, gathers = rewrite_as_gathers(graph_def, regions)
    return {**compile_as_calls(graph_def, regions, fetches).to_json(), "segment_sums_as_gathers": gathers}


EMITTED_COPY = re.compile(r"^tag/p(\d+)/([rg]\d+)/(.+)$")


def mark_emitted_for_xla(graph_def, plan: FusionPlan, fetches: list[str]) -> dict:
    """Mark the fusion plan in an emitted (distributed) step, as `mark_for_xla` does for the single-device one.

    The emitter copies op `name` once per copy of its placement, as `tag/p<placement>/<r|g><k>/name`:
    each copy of a pattern on one device becomes its own cluster,
    `_XlaScope="fusion_<k>/p<placement>/<copy>/t<task>/<device>"` (an XLA cluster runs on one device, and
    different scopes never merge). A region's ops on one device are one function call whatever their placement.
    Returns what was marked.
    """
    pattern_of = pattern_scopes(plan)
    region_of = {name: k for k, region in enumerate(plan.regions) for name in region}
    scope_of: dict[str, str] = {}
    regions: dict[tuple[int, str], list[str]] = {}
    for node in graph_def.node:
        match = EMITTED_COPY.match(node.name)
        if match is None:
            continue
        name = match.group(3)
        if name in region_of:
            regions.setdefault((region_of[name], node.device), []).append(node.name)
        elif name in pattern_of:
            scope = f"{pattern_of[name]}/p{match.group(1)}/{match.group(2)}"
            scope_of[node.name] = f"{scope}/{_short_device(node.device)}" if node.device else scope
    marked = _mark_scopes(graph_def, scope_of)
    calls = _compile_regions(graph_def, list(regions.values()), fetches)
    return {"patterns": len(plan.patterns), "ops_fused": plan.ops_fused, "regions": len(plan.regions),
            "clusters": len(set(scope_of.values())) + calls["calls"], "nodes_marked": marked, **calls}


def _short_device(device: str) -> str:
    """`/job:worker/replica:0/task:1/device:GPU:2` -> `t1/gpu2`."""
    found = re.search(r"task:(\d+)/device:([A-Za-z_]+):(\d+)", device)
    return f"t{found.group(1)}/{found.group(2).lower()}{found.group(3)}" if found else re.sub(r"\W+", "_", device)


def _mark_scopes(graph_def, scope_of: dict[str, str]) -> int:
    """Set `_XlaCompile`/`_XlaScope` on the named nodes and on constants read only by one scope."""
    scope_of = dict(scope_of)
    nodes = {node.name: node for node in graph_def.node}
    consumers: dict[str, set[str]] = {}
    for node in graph_def.node:
        for text in node.input:
            consumers.setdefault(input_node(text), set()).add(node.name)
    for node in graph_def.node:
        if node.op == "Const" and node.name not in scope_of:
            scopes = {scope_of.get(c) for c in consumers.get(node.name, ())}
            if len(scopes) == 1 and None not in scopes:
                scope_of[node.name] = scopes.pop()
    marked = 0
    for name, scope in scope_of.items():
        node = nodes.get(name)
        if node is None:
            continue
        node.attr["_XlaCompile"].b = True
        node.attr["_XlaScope"].s = scope.encode()
        node.attr["_XlaSeparateCompiledGradients"].b = False
        marked += 1
    return marked
