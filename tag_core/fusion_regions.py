"""Compiled regions: which ops of a fusion plan XLA compiles as one program.

A fusion pattern (`fusion.py`) is what fuses into one kernel, and only memory-intensive ops ever do. A region
is what compiles together: connected ops handed to XLA as one program. Compute-intensive ops inside a region
stay library calls: XLA's CPU backend emits each MatMul or convolution as its own `dot`/`convolution`
instruction calling its GEMM runtime, never inside a fused loop (test_fusion_regions checks that in the
optimised HLO). What a region saves is the executor's per-op cost and the buffers between kernels, which on a
CPU are a large part of a transformer's step: a 2-layer BERT step measured 0.89 of the plain step as one
region, against 0.91-0.92 with the tuned patterns as clusters of their own (benchmarks/fusion.json).

Regions are only proposed by tuning (`fusion_tune.tune_plan`), which times every compute op alone as a TF
kernel and as an XLA library call: an op XLA runs more than `LIBRARY_SLOWDOWN` times slower (a depthwise
convolution on this CPU: 27 times) stays outside, and so does one that could not be timed. The step check
then keeps the regions only if the whole step is fastest with them.

Also outside every region: ops whose XLA lowering computes something else than TF's kernel (random
numbers: the emitted step must match the reference step), v1 control flow and function calls, and
graph plumbing (placeholders, handles, constants; a constant read only by one region joins it when marked).
"""

from __future__ import annotations

from .disjoint_sets import DisjointSets

LIBRARY_SLOWDOWN = 2.0
OUTSIDE = {
    "Placeholder", "PlaceholderWithDefault", "VarHandleOp", "Const", "NoOp", "Enter", "Exit", "Merge", "Switch",
    "NextIteration", "LoopCond", "While", "StatelessWhile", "If", "StatelessIf", "PartitionedCall",
    "StatefulPartitionedCall", "Assert", "PrintV2", "Print",
}
OUTSIDE_PREFIXES = ("Random", "StatelessRandom", "TruncatedNormal", "StatelessTruncatedNormal", "Multinomial",
                    "StatelessMultinomial", "TensorList", "TensorArray", "Stack", "_")
# Grappler rewrites that TF's auto-clustering turns off for itself: left on, they replace marked nodes by fused
# nodes with no XLA kernel (oneDNN's MatMul+BiasAdd, a chain of unary ops), which then split a region in pieces.
REWRITES_OFF = ("remapping", "arithmetic_optimization")


def may_join(op_type: str) -> bool:
    return op_type not in OUTSIDE and not op_type.startswith(OUTSIDE_PREFIXES)


def compiled_regions(graph_def, excluded: set[str]) -> list[list[str]]:
    """Connected pieces (along data and control edges) of the step's ops that may join a region, less `excluded`; each
    piece of two or more ops is one region, its ops in the GraphDef's order. A piece that reads only
    constants is left out: grappler folds it before XLA would see it."""
    nodes = [node for node in graph_def.node if may_join(node.op) and node.name not in excluded]
    index = {node.name: i for i, node in enumerate(nodes)}
    op_type = {node.name: node.op for node in graph_def.node}
    sets = DisjointSets(len(nodes))
    reads_data = set()
    for i, node in enumerate(nodes):
        for text in node.input:
            source = text.lstrip("^").split(":")[0]
            if source in index:
                sets.union(index[source], i)
            elif op_type.get(source) != "Const":
                reads_data.add(i)
    pieces: dict[int, list[int]] = {}
    for i, root in enumerate(sets.roots() if nodes else []):
        pieces.setdefault(int(root), []).append(i)
    return [[nodes[i].name for i in members] for members in pieces.values()
            if len(members) > 1 and reads_data.intersection(members)]


def session_config(plan, config=None):
    """`config` (a new ConfigProto if None) with what running `plan`'s marked graph needs: with regions, the
    grappler rewrites of `REWRITES_OFF` off."""
    import tensorflow as tf

    config = config if config is not None else tf.compat.v1.ConfigProto()
    return turn_off(config, REWRITES_OFF if plan is not None and plan.regions else ())


def turn_off(config, rewrites):
    """`config` with the named grappler rewrites (RewriterConfig toggles) off."""
    from tensorflow.core.protobuf import rewriter_config_pb2

    for name in rewrites:
        setattr(config.graph_options.rewrite_options, name, rewriter_config_pb2.RewriterConfig.OFF)
    return config
