"""Compiled regions: which ops of a fusion plan XLA compiles as one program.

A fusion pattern (`patterns.py`) is what fuses into one kernel, and only memory-intensive ops ever do. A region
is what compiles together: connected ops handed to XLA as one program. Compute-intensive ops inside a region
stay library calls: XLA's CPU backend emits each MatMul or convolution as its own `dot`/`convolution`
instruction calling its GEMM runtime, never inside a fused loop (test_fusion_regions checks that in the
optimised HLO). What a region saves is the executor's per-op cost and the buffers between kernels, which on a
CPU are a large part of a transformer's step: a 2-layer BERT step measured 0.84 of the plain step as one
region, against 0.87-0.89 with the tuned patterns as clusters of their own (benchmarks/fusion.json).

Regions are only proposed by tuning (`tune.tune_plan`), which times every compute op alone as a TF
kernel and as an XLA library call: an op XLA runs more than `LIBRARY_SLOWDOWN` times slower (a depthwise
convolution on this CPU: 27 times) stays outside, and so does one that could not be timed. The step check
then keeps the regions only if the whole step is fastest with them.

Also outside every region: ops with no XLA kernel; ops whose XLA lowering computes something else than TF's
kernel (random numbers: the emitted step must match the reference step); v1 control flow and function calls;
graph plumbing (placeholders, handles; a constant with no inputs is copied into each region that reads it); and
whatever the step does not run (the initialisation block). A region runs as one must-compile function call
(`region_calls.py`), which compiles it as one XLA program whatever the order of its variable reads and writes.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from tag_core.capture.graph import input_node, reachable
from tag_core.disjoint_sets import DisjointSets

LIBRARY_SLOWDOWN = 2.0
OUTSIDE = {
    "Placeholder", "PlaceholderWithDefault", "VarHandleOp", "Enter", "Exit", "Merge", "Switch",
    "NextIteration", "LoopCond", "While", "StatelessWhile", "If", "StatelessIf", "PartitionedCall",
    "StatefulPartitionedCall", "Assert", "PrintV2", "Print",
}
OUTSIDE_PREFIXES = ("Random", "StatelessRandom", "TruncatedNormal", "StatelessTruncatedNormal", "Multinomial",
                    "StatelessMultinomial", "TensorList", "TensorArray", "Stack", "_")
# Grappler rewrites the session must leave off: the memory optimizer rewrites a large AddN inside a region's
# function into TemporaryVariable accumulations, which XLA cannot compile.
REWRITES_OFF = ("memory_optimization",)


def may_join(node) -> bool:
    if node.op == "Const":
        return bool(node.input)  # one with control inputs orders work; one without is copied where read
    return node.op not in OUTSIDE and not node.op.startswith(OUTSIDE_PREFIXES) and has_xla_kernel(node.op)


@cache
def has_xla_kernel(op_type: str) -> bool:
    """Whether XLA's CPU JIT registers a kernel for the op (GPU hosts register nearly the same set)."""
    from tensorflow.python.framework import kernels

    _register_xla_kernels()
    return any(k.device_type == "XLA_CPU_JIT" for k in kernels.get_registered_kernels_for_op(op_type).kernel)


@cache
def _register_xla_kernels() -> None:
    """XLA registers its JIT kernels with TF's registry on its first compilation."""
    import tensorflow as tf

    tf.function(lambda x: x + 1.0, jit_compile=True)(tf.constant(0.0))


def compiled_regions(graph_def, excluded: set[str], roots: list[str]) -> list[list[str]]:
    """Connected pieces (along data and control edges) of the ops the step runs for `roots` (the names it fetches)
    that may join a region, less `excluded`; each piece of two or more ops is one region, its ops in the GraphDef's
    order. A piece that reads only constants is left out: grappler folds it before XLA would see it."""
    inputs = {node.name: [input_node(text) for text in node.input] for node in graph_def.node}
    runs = reachable({input_node(root) for root in roots} & set(inputs), inputs)
    nodes = [node for node in graph_def.node if node.name in runs and node.name not in excluded and may_join(node)]
    index = {node.name: i for i, node in enumerate(nodes)}
    op_type = {node.name: node.op for node in graph_def.node}
    sets = DisjointSets(len(nodes))
    reads_data = set()
    for i, node in enumerate(nodes):
        for text in node.input:
            source = input_node(text)
            if source in index:
                sets.union(index[source], i)
            elif op_type.get(source) != "Const":
                reads_data.add(i)
    pieces: dict[int, list[int]] = {}
    for i, root in enumerate(sets.roots() if nodes else []):
        pieces.setdefault(int(root), []).append(i)
    return [[nodes[i].name for i in members] for members in pieces.values()
            if len(members) > 1 and reads_data.intersection(members)]


def outside_regions(plan):
    """`plan` less the patterns whose ops all lie in its regions: XLA compiles those within the region's program,
    so they mark nothing of their own, and keeping them would report (and vary with) patterns that change nothing."""
    inside = {name for region in plan.regions for name in region}
    keep = [k for k, pattern in enumerate(plan.patterns) if not inside.issuperset(pattern)]
    if len(keep) == len(plan.patterns):
        return plan
    saving = plan.measured.get("pattern_saving_us")
    measured = dict(plan.measured, patterns_inside_regions=len(plan.patterns) - len(keep))
    if saving is not None and len(saving) == len(plan.patterns):
        measured["pattern_saving_us"] = [saving[k] for k in keep]
    patterns = [plan.patterns[k] for k in keep]
    fused_ops = sum(len(p) for p in patterns)
    return replace(plan, patterns=patterns, kernels_after=plan.kernels_before - fused_ops + len(patterns),
                   measured=measured)


def session_config(plan, config=None):
    """`config` (a new ConfigProto if None) with what running `plan`'s marked graph needs: with regions, the
    grappler rewrites of `REWRITES_OFF` off."""
    import tensorflow as tf

    config = config if config is not None else tf.compat.v1.ConfigProto()
    return turn_off(config, REWRITES_OFF if plan is not None and plan.regions else ())


def turn_off(config, rewrites):
    """`config` with the named grappler rewrites (RewriterConfig toggles, or the memory optimizer) off."""
    from tensorflow.core.protobuf import rewriter_config_pb2

    config_type = rewriter_config_pb2.RewriterConfig
    for name in rewrites:
        off = config_type.NO_MEM_OPT if name == "memory_optimization" else config_type.OFF
        setattr(config.graph_options.rewrite_options, name, off)
    return config
