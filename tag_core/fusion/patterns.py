"""FusionStitching-style fusion plans for memory-intensive ops.

Memory-intensive ops (elementwise, broadcast, reduce, transpose, slice,
gather, concat) are fused into larger kernels; compute-intensive ops (MatMul,
Conv, depthwise Conv) never are. Ops are visited in post-order (consumers
first); each step extends a beam of partial plans with the op's choices:
stay alone, join a consumer's pattern, or join a sibling pattern that reads
the same tensor (a "remote" merge with no edge between the two). A merge is
allowed only if no cycle results: no path may leave one pattern and re-enter
the other through an op outside both. A pattern is scored as memory traffic
saved plus kernel launches saved, less a penalty when a remote merge
serialises work that could have run side by side.

Variable reads and in-place updates (ReadVariableOp, Assign*VariableOp) may
join a pattern of memory-intensive ops but never form one alone: the
optimizer's update of a variable (Adam: the two moments, then the variable)
then runs as one pass over its elements instead of a kernel per arithmetic op
with the intermediates written out between them. A read aliases the
variable's buffer, so it saves a launch and no traffic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tag_core.capture.graph import OpGraph
from tag_core.cluster.gpu_catalog import GpuType, lookup_gpu
from tag_core.errors import TagInputError

COMPUTE = {
    "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "Conv2D", "Conv3D",
    "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2",
    "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter",
}
ELEMENTWISE = {
    "Add", "AddV2", "AddN", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "FloorDiv", "FloorMod", "Maximum",
    "Minimum", "Neg", "Abs", "Sign", "Square", "SquaredDifference", "Sqrt", "Rsqrt", "RsqrtGrad", "SqrtGrad",
    "Pow", "Exp", "Log", "Log1p", "Expm1", "Reciprocal", "Erf", "Tanh", "TanhGrad", "Sigmoid", "SigmoidGrad",
    "Relu", "ReluGrad", "Relu6", "Relu6Grad", "Elu", "EluGrad", "Selu", "Softplus", "SoftplusGrad", "Cast",
    "Select", "SelectV2", "Greater", "GreaterEqual", "Less", "LessEqual", "Equal", "NotEqual", "LogicalAnd",
    "LogicalOr", "LogicalNot", "ZerosLike", "OnesLike", "BiasAdd", "ClipByValue", "Round", "Floor", "Ceil",
}
LAYOUT = {
    "Reshape", "Squeeze", "ExpandDims", "Transpose", "Slice", "StridedSlice", "StridedSliceGrad", "ConcatV2",
    "Pack", "Unpack", "Split", "SplitV", "Tile", "BroadcastTo", "GatherV2", "Pad", "PadV2", "Fill",
}
ROW_REDUCTIONS = {"Softmax", "LogSoftmax", "SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits"}
COLUMN_REDUCTIONS = {"BiasAddGrad"}
AXIS_REDUCTIONS = {"Sum", "Mean", "Max", "Min", "Prod", "All", "Any"}
FUSIBLE = ELEMENTWISE | LAYOUT | ROW_REDUCTIONS | COLUMN_REDUCTIONS | AXIS_REDUCTIONS
VARIABLE_IO = {"ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"}

NONE, ROW, COLUMN = 0, 1, 2
LAUNCH_S = 5e-6  # one GPU kernel launch
MAX_PATTERN_OPS = 48
BEAM_WIDTH = 3


def classify(op_type: str) -> str:
    if op_type in COMPUTE:
        return "compute"
    if op_type in FUSIBLE:
        return "memory"
    if op_type in VARIABLE_IO:
        return "variable"
    return "other"


@dataclass
class FusionPlan:
    model: str
    patterns: list[list[str]]  # op names of each fused pattern (two or more ops)
    kernels_before: int
    kernels_after: int
    saved_s: float  # estimated time saved per step on the reference GPU
    reference_gpu: str
    measured: dict = field(default_factory=dict)
    # Ops XLA compiles as one program each, compute ops as library calls (regions.py); patterns inside a
    # region are then fused by XLA within it. Only tuning proposes regions.
    regions: list[list[str]] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict) -> "FusionPlan":
        """A plan as `to_json` wrote it; TagInputError names the field that is not."""
        def need(cond: bool, where: str, problem: str) -> None:
            if not cond:
                raise TagInputError(where, problem)

        need(isinstance(data, dict), "fusion plan", "must be a JSON object (`tag fuse --json`)")
        for key in ("model", "patterns", "kernels_before", "kernels_after"):
            need(key in data, key, "missing field")
        need(isinstance(data["model"], str), "model", "must be a model name")
        patterns, regions = data["patterns"], data.get("regions", [])
        for key, groups in (("patterns", patterns), ("regions", regions)):
            need(isinstance(groups, list), key, "must be a list, each entry a list of op names")
            for k, group in enumerate(groups):
                need(isinstance(group, list) and bool(group) and all(isinstance(n, str) for n in group),
                     f"{key}[{k}]", "must be a non-empty list of op names")
        for key in ("kernels_before", "kernels_after"):
            need(isinstance(data[key], int) and not isinstance(data[key], bool) and data[key] >= 0, key,
                 "must be a non-negative integer")
        saved = data.get("estimated_saving_s", 0.0)
        need(isinstance(saved, (int, float)) and not isinstance(saved, bool), "estimated_saving_s", "must be a number")
        need(isinstance(data.get("reference_gpu", ""), str), "reference_gpu", "must be a GPU name")
        need(isinstance(data.get("measured", {}), dict), "measured", "must be a JSON object")
        return cls(data["model"], patterns, data["kernels_before"], data["kernels_after"], saved,
                   data.get("reference_gpu", ""), dict(data.get("measured", {})), regions)

    @property
    def ops_fused(self) -> int:
        return sum(len(p) for p in self.patterns)

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "patterns": self.patterns,
            "ops_fused": self.ops_fused,
            "kernels_before": self.kernels_before,
            "kernels_after": self.kernels_after,
            "estimated_saving_s": self.saved_s,
            "reference_gpu": self.reference_gpu,
            "regions": self.regions,
            **({"measured": self.measured} if self.measured else {}),
        }


@dataclass
class _Candidate:
    pattern: np.ndarray  # op -> pattern id (an op's own index when alone)
    score: float


def reduction_kinds(graph: OpGraph, graph_def=None) -> np.ndarray:
    """NONE / ROW / COLUMN per op. Axis reductions need the step GraphDef to read their axes."""
    kinds = np.zeros(len(graph.ops), dtype=np.int8)
    axes = _reduction_axes(graph_def) if graph_def is not None else {}
    for i, op in enumerate(graph.ops):
        if op.type in ROW_REDUCTIONS:
            kinds[i] = ROW
        elif op.type in COLUMN_REDUCTIONS:
            kinds[i] = COLUMN
        elif op.type in AXIS_REDUCTIONS:
            rank, reduced = axes.get(op.name, (None, None))
            # Reducing the innermost axis reads rows; anything else strides across them.
            kinds[i] = ROW if rank is not None and (rank - 1) in reduced else COLUMN
    return kinds


def _reduction_axes(graph_def) -> dict[str, tuple[int, set[int]]]:
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    found = {}
    for op in graph.get_operations():
        if op.type not in AXIS_REDUCTIONS or op.inputs[1].op.type != "Const":
            continue
        rank = op.inputs[0].shape.rank
        if rank is None:
            continue
        values = np.atleast_1d(tf.make_ndarray(op.inputs[1].op.get_attr("value")))
        found[op.name] = (rank, {int(a) % max(rank, 1) for a in values})
    return found


def plan_fusion(
    graph: OpGraph,
    graph_def=None,
    reference_gpu: GpuType | str = "V100-32GB",
    beam_width: int = BEAM_WIDTH,
    max_pattern_ops: int = MAX_PATTERN_OPS,
    variables: bool = True,
) -> FusionPlan:
    """`variables`: let variable reads and updates join patterns (see the module's docstring)."""
    gpu = lookup_gpu(reference_gpu) if isinstance(reference_gpu, str) else reference_gpu
    n = len(graph.ops)
    kind = [classify(op.type) for op in graph.ops]
    memory = np.array([k == "memory" for k in kind]) & ~_library_epilogues(graph)
    fusible = memory | (np.array([k == "variable" for k in kind]) if variables else False)
    aliases = np.array([op.type == "ReadVariableOp" for op in graph.ops])
    kinds = reduction_kinds(graph, graph_def)
    order = graph.topological_order()
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    successors: list[list[int]] = [[] for _ in range(n)]
    predecessors: list[list[int]] = [[] for _ in range(n)]
    out_bytes: dict[tuple[int, int], int] = {}
    for e in graph.edges:
        successors[e.src].append(e.dst)
        predecessors[e.dst].append(e.src)
        if e.tensor and not aliases[e.src]:
            out_bytes[(e.src, e.dst)] = out_bytes.get((e.src, e.dst), 0) + e.bytes
    context = _Context(gpu, fusible, kinds, position, successors, predecessors, out_bytes, max_pattern_ops)

    beam = [_Candidate(np.arange(n), 0.0)]
    for v in reversed(order):  # post-order: consumers before producers
        if not fusible[v]:
            continue
        extended = []
        for candidate in beam:
            extended.append(candidate)  # v stays alone
            for target, gain in context.merge_options(candidate.pattern, v):
                pattern = candidate.pattern.copy()
                pattern[pattern == pattern[v]] = target
                extended.append(_Candidate(pattern, candidate.score + gain))
        extended.sort(key=lambda c: -c.score)
        beam = _distinct(extended, beam_width)
    best = beam[0]
    patterns: dict[int, list[int]] = {}
    for i, p in enumerate(best.pattern):
        patterns.setdefault(int(p), []).append(i)
    fused = [sorted(members, key=lambda i: position[i]) for members in patterns.values()
             if len(members) > 1 and memory[members].any()]  # variable reads and updates alone gain nothing
    fused.sort(key=lambda members: position[members[0]])
    kernels_before = n
    kernels_after = n - sum(len(m) for m in fused) + len(fused)
    return FusionPlan(
        model=graph.model,
        patterns=[[graph.ops[i].name for i in members] for members in fused],
        kernels_before=kernels_before,
        kernels_after=kernels_after,
        saved_s=best.score,
        reference_gpu=gpu.name,
    )


EPILOGUE_ACTIVATIONS = {"Relu", "Relu6", "Elu", "Selu", "Sigmoid", "Tanh"}


def _library_epilogues(graph: OpGraph) -> np.ndarray:
    """BiasAdd right after a MatMul/Conv, and an activation right after that BiasAdd.

    oneDNN and cuDNN already fuse these into the compute kernel's epilogue; pulling
    them into an XLA cluster would break that fusion and make the step slower.
    """
    producers: list[list[int]] = [[] for _ in graph.ops]
    for e in graph.edges:
        if e.tensor:
            producers[e.dst].append(e.src)
    types = [op.type for op in graph.ops]
    epilogue = np.zeros(len(graph.ops), dtype=bool)
    for i, op_type in enumerate(types):
        if op_type == "BiasAdd" and any(types[p] in COMPUTE for p in producers[i]):
            epilogue[i] = True
    for i, op_type in enumerate(types):
        if op_type in EPILOGUE_ACTIVATIONS and any(epilogue[p] for p in producers[i]):
            epilogue[i] = True
    return epilogue


def _distinct(candidates: list[_Candidate], width: int) -> list[_Candidate]:
    kept, seen = [], set()
    for candidate in candidates:
        key = candidate.pattern.tobytes()
        if key not in seen:
            seen.add(key)
            kept.append(candidate)
        if len(kept) == width:
            break
    return kept


@dataclass
class _Context:
    gpu: GpuType
    fusible: np.ndarray
    kinds: np.ndarray
    position: np.ndarray
    successors: list[list[int]]
    predecessors: list[list[int]]
    out_bytes: dict[tuple[int, int], int]
    max_pattern_ops: int

    def merge_options(self, pattern: np.ndarray, v: int):
        """(target pattern, gain in seconds) for each legal merge of v's pattern."""
        own = pattern[v]
        members_v = np.flatnonzero(pattern == own)
        targets: dict[int, bool] = {}  # pattern -> is a remote (edge-less) merge
        for consumer in self.successors[v]:
            if self.fusible[consumer] and pattern[consumer] != own:
                targets[int(pattern[consumer])] = False
        for producer in self.predecessors[v]:
            for sibling in self.successors[producer]:
                if sibling != v and self.fusible[sibling] and pattern[sibling] != own:
                    targets.setdefault(int(pattern[sibling]), True)
        for target, remote in targets.items():
            members_t = np.flatnonzero(pattern == target)
            if len(members_v) + len(members_t) > self.max_pattern_ops:
                continue
            kinds = {int(k) for k in self.kinds[np.concatenate([members_v, members_t])]} - {NONE}
            if kinds == {ROW, COLUMN}:
                continue  # row and column reductions want different thread layouts
            if self._creates_cycle(pattern, members_v, members_t, own, target):
                continue
            gain = self._gain(pattern, members_v, members_t, remote)
            if gain > 0:
                yield target, gain

    def _gain(self, pattern, members_a, members_b, remote: bool) -> float:
        bandwidth = self.gpu.mem_bw_gbps * 1e9
        in_a, in_b = set(members_a.tolist()), set(members_b.tolist())
        saved_bytes = 0.0
        for src_set, dst_set in ((in_a, in_b), (in_b, in_a)):
            for s in src_set:
                for d in self.successors[s]:
                    if d in dst_set:
                        nbytes = self.out_bytes.get((s, d), 0)
                        leaves = any(c not in in_a and c not in in_b for c in self.successors[s])
                        saved_bytes += nbytes if leaves else 2 * nbytes  # the read; and the write if internal
        shared_inputs = {p for m in in_a for p in self.predecessors[m]} & {p for m in in_b for p in self.predecessors[m]}
        saved_bytes += sum(self.out_bytes.get((p, m), 0) for p in shared_inputs for m in in_b if (p, m) in self.out_bytes)
        gain = saved_bytes / bandwidth + LAUNCH_S
        if remote:
            # Two independent kernels could have overlapped: charge a share of the smaller one.
            gain -= 0.25 * LAUNCH_S
        return gain

    def _creates_cycle(self, pattern, members_a, members_b, a: int, b: int) -> bool:
        """True if some path leaves one pattern and re-enters the other through an outside op."""
        for source, target_id, target_members in ((members_a, b, members_b), (members_b, a, members_a)):
            limit = self.position[target_members].max()
            inside = {a, b}
            stack = [d for s in source for d in self.successors[s] if pattern[d] not in inside]
            seen = set(stack)
            while stack:
                node = stack.pop()
                if self.position[node] > limit:
                    continue
                for d in self.successors[node]:
                    if pattern[d] == target_id:
                        return True
                    if d not in seen and pattern[d] not in inside:
                        seen.add(d)
                        stack.append(d)
        return False


def pattern_scopes(plan: FusionPlan) -> dict[str, str]:
    """op name -> XLA scope `fusion_<k>` of pattern k, for the ops of patterns outside every region (a region takes
    in the patterns inside it: XLA fuses them within the region's program)."""
    in_region = {name for region in plan.regions for name in region}
    return {name: f"fusion_{k}" for k, pattern in enumerate(plan.patterns) for name in pattern if name not in in_region}
