"""Sufficient Factor Broadcasting: which replicated gradients to rebuild from their factors.

A weight gradient such as dW = Xᵀ·dY is a sum over the batch. Instead of summing the
replicas' partial dW (AllReduce, or a push to the PS), the replicas can all-gather X
and dY and each compute dW on the whole batch: cheaper when the factors are smaller
than the gradient, exact either way. TAG's choice, per gradient, is a small MILP:

    variables   x_i = 1: op i of the gradient's subgraph runs on the whole batch on every
                replica (on the PS only, in a PS group);  b_t = 1: tensor t is gathered
    minimise    sum_i extra_compute_i x_i + sum_t gather_t b_t - sync_saved x_g
    subject to  b_t >= x_i - x_j  for every batch tensor t from op j to op i of the subgraph
                b_t >= x_i        for every batch tensor t from outside into op i
                x_i <= x_j        for a tensor of j that is a per-replica partial result
                                  without the batch dimension (it cannot be gathered)

The subgraph of a gradient is its producing op g plus backward ops of the same group that
feed only the subgraph (at most `depth` edges up, `max_ops` ops): Keras' Dense on 3-D inputs,
for one, makes its kernel gradient as a batched MatMul, a Sum over the batch and a Reshape. Costs come from the
simulator's cost model: each device's profile at its batch share and at the whole batch,
and the topology's collectives (hierarchical all-gather and AllReduce; for a PS, the
replicas' transfers to it). A solve that does not finish within its time limit leaves the
gradient synchronised as before, with a warning. Gradients whose saving cannot beat a lower
bound on any SFB's cost (`_lower_bound`) are ruled out without a solve.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from tag_core.simulate.cost import transfer_time
from tag_core.simulate.expand import allreduce_shape, place
from tag_core.simulate.simulator import Simulator
from tag_core.simulate.stopwatch import Stopwatch
from tag_core.simulate.strategy import Strategy
from tag_core.simulate.units import SINGLE, SPLIT

DEFAULT_TIME_LIMIT_S = 5.0
DEFAULT_DEPTH = 4
DEFAULT_MAX_OPS = 8
STATUSES = ("sfb", "no_gain", "ruled_out", "timeout")


@dataclass
class Subgraph:
    """The ops around one replicated gradient that SFB may duplicate, and the tensors feeding them."""

    variable: str
    gradient_op: int
    group: int
    ops: list[int]  # ops[0] is the gradient op
    partial_inputs: dict[int, list[int]]  # producer -> consumers in `ops` (per-replica partial, no batch axis)


@dataclass
class Decision:
    variable: str
    gradient_op: str
    status: str  # one of STATUSES
    duplicated: list[int] = field(default_factory=list)
    gathered: list[int] = field(default_factory=list)  # producers of the tensors gathered
    sync_saved_s: float = 0.0  # the gradient's sync, which SFB would save
    extra_compute_s: float = 0.0
    gather_s: float = 0.0
    solve_s: float = 0.0

    @property
    def saving_s(self) -> float:
        """Estimated seconds saved by what was chosen (0 when nothing was)."""
        return self.sync_saved_s - self.extra_compute_s - self.gather_s if self.duplicated else 0.0


@dataclass
class SfbResult:
    strategy: Strategy  # the input strategy with the kept decisions in `sfb`
    decisions: list[Decision]  # every replicated gradient considered
    kept: list[str]  # variables whose SFB the simulator confirmed
    time_without_s: float
    time_with_s: float
    oom: bool = False  # the kept plan runs out of memory (so did the plan without SFB)

    def to_dict(self, sim: Simulator) -> dict[str, Any]:
        ops = sim.graph.ops
        chosen = {d.variable: d for d in self.decisions}
        solves = [d.solve_s for d in self.decisions if d.status in ("sfb", "no_gain", "timeout")]
        return {
            "gradients": [{
                "variable": v, "gradient_op": chosen[v].gradient_op,
                "duplicated": [ops[i].name for i in chosen[v].duplicated],
                "op_types": [ops[i].type for i in chosen[v].duplicated],
                "gathered": [ops[i].name for i in chosen[v].gathered],
                "estimated_saving_s": chosen[v].saving_s, "sync_saved_s": chosen[v].sync_saved_s,
                "extra_compute_s": chosen[v].extra_compute_s, "gather_s": chosen[v].gather_s,
            } for v in self.kept],
            "considered": len(self.decisions),
            "by_status": {s: sum(d.status == s for d in self.decisions) for s in STATUSES},
            "solves": len(solves),
            "solve_s_median": float(np.median(solves)) if solves else 0.0,
            "solve_s_max": float(max(solves)) if solves else 0.0,
            "iteration_time_s_without_sfb": self.time_without_s,
            "iteration_time_s": self.time_with_s,
        }


def find_subgraphs(sim: Simulator, strategy: Strategy, depth: int = DEFAULT_DEPTH,
                   max_ops: int = DEFAULT_MAX_OPS, placement=None) -> list[Subgraph]:
    """One subgraph per gradient that `strategy` synchronises (replicated, on two or more devices).
    `placement`: `place` of the strategy without SFB, when the caller has it."""
    p = placement if placement is not None else place(sim, replace(strategy, sfb={}))
    preds, succs = sim.predecessors, sim.successors
    dependent = sim.data_dependent
    groups = strategy.op_groups
    out = []
    for var, gop in zip(sim.sync_vars.tolist(), sim.sync_grad_op.tolist()):
        g = int(groups[gop])
        if strategy.options[g] not in ("allreduce", "ps") or p.kind[gop] != SPLIT or p.group_active[g].sum() < 2:
            continue
        chosen = [gop]
        inside = {gop}
        frontier = [gop]
        for _ in range(depth):
            nxt = []
            for i in frontier:
                for j in preds[i]:
                    if (j not in inside and len(chosen) < max_ops and sim.is_gradient[j] and not sim.is_apply[j]
                            and groups[j] == g and p.kind[j] == SPLIT and all(k in inside for k in succs[j])):
                        inside.add(j)
                        chosen.append(j)
                        nxt.append(j)
            frontier = nxt
        partial_in: dict[int, list[int]] = {}
        for i in chosen:
            for e in sim.in_edges[i]:
                j = int(sim.e_src[e])
                if not sim.e_batch[e] and dependent[j]:  # inside too: a whole-batch copy of i needs j's whole sum
                    partial_in.setdefault(j, []).append(i)
        out.append(Subgraph(sim.graph.variables[var].name, gop, g, chosen, partial_in))
    return out


def decide(sim: Simulator, strategy: Strategy, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
           depth: int = DEFAULT_DEPTH, max_ops: int = DEFAULT_MAX_OPS,
           keep_going: Callable[[], bool] | None = None) -> list[Decision]:
    """The MILP's answer for every synchronised gradient of `strategy`, one MILP at a time while
    `keep_going()` (a planner's deadline); gradients not reached get no decision and keep their sync."""
    p = place(sim, replace(strategy, sfb={}))
    costs = _Costs(sim, strategy, p)
    decisions = []
    for sub in find_subgraphs(sim, strategy, depth, max_ops, placement=p):
        if keep_going is not None and not keep_going():
            break
        decisions.append(_solve(sim, sub, costs, time_limit_s))
    return decisions


def apply_sfb(sim: Simulator, strategy: Strategy, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
              depth: int = DEFAULT_DEPTH, max_ops: int = DEFAULT_MAX_OPS,
              decisions: list[Decision] | None = None,
              keep_going: Callable[[float], bool] | None = None) -> SfbResult:
    """Decide SFB per gradient (unless `decisions` for the same placement are given), then keep each
    chosen gradient (largest estimated saving first) only if the simulated step gets faster with it:
    the per-gradient costs ignore contention. Before each trial, `keep_going(seconds)` (a planner's
    deadline) is asked whether one more simulation, as long as the plan's without SFB, still fits."""
    base = replace(strategy, sfb={})
    if decisions is None:
        decisions = decide(sim, base, time_limit_s, depth, max_ops)
    watch = Stopwatch()  # numba's first compiling is no trial's cost
    best = sim.run(base)
    run_s = watch.seconds()
    without = best.iteration_time_s
    kept: dict[str, list[int]] = {}
    chosen = sorted((d for d in decisions if d.status == "sfb"), key=lambda d: -d.saving_s)
    for d in chosen:
        if keep_going is not None and not keep_going(run_s):
            break
        trial = replace(base, sfb={**kept, d.variable: d.duplicated})
        result = sim.run(trial)
        if result.iteration_time_s < best.iteration_time_s and (not result.oom or best.oom):
            best, kept = result, trial.sfb
    return SfbResult(replace(base, sfb=kept), decisions, list(kept), without, best.iteration_time_s, bool(best.oom))


# ---- costs ------------------------------------------------------------------------------


class _Costs:
    """Seconds each MILP term costs for one strategy: per op, per gathered tensor, per gradient."""

    def __init__(self, sim: Simulator, strategy: Strategy, p):
        self.sim, self.s, self.p = sim, strategy, p
        self._shape: dict[int, tuple] = {}
        self._extra: dict[tuple[int, int], np.ndarray] = {}

    def devices(self, group: int) -> tuple[np.ndarray, np.ndarray]:
        devs = np.flatnonzero(self.p.group_active[group])
        return devs, self.p.group_share[group, devs]

    def ps_device(self, variable: str) -> int:
        v = self.sim.var_index[variable]
        ops = np.flatnonzero((self.sim.apply_owner == v) & (self.p.kind == SINGLE))
        return int(self.p.single_dev[ops[0]]) if len(ops) and self.s.options[self.s.op_groups[ops[0]]] == "ps" else -1

    def extra_compute(self, op: int, group: int, ps: int) -> float:
        """Whole batch instead of the replica's share, on the slowest replica (the PS alone in a PS group)."""
        if (group, ps) not in self._extra:
            sim = self.sim
            devs, shares = self.devices(group)
            if ps >= 0:
                devs, shares = devs[devs == ps], shares[devs == ps]
            # Thousands of replicas, a few kinds: one time table per (GPU type, share).
            _, first = np.unique(np.column_stack([sim.dev_gpu_id[devs], np.round(shares, 12)]), axis=0,
                                 return_index=True)
            worst = np.zeros(sim.n)
            for d, share in zip(devs[first].tolist(), shares[first].tolist()):
                gpu = sim.dev_gpu[d]
                worst = np.maximum(worst, sim.compute.times(gpu, sim.batch) - sim.compute.times(gpu, sim.batch * share))
            self._extra[group, ps] = worst
        return float(self._extra[group, ps][op])

    def gather(self, nbytes: float, group: int, ps: int) -> float:
        """All replicas' rows to every replica (all-gather), or to the PS."""
        devs, shares = self.devices(group)
        if ps >= 0:
            return self._to_ps(devs, shares * nbytes, ps)
        counts, intra, inter, _ = self.shape(group)
        return float(self.sim.comm.allgather(nbytes, shares, counts, intra, inter))

    def sync(self, nbytes: float, group: int, ps: int) -> float:
        """What the gradient's sync costs now: its AllReduce, or every replica's push to the PS."""
        devs, _ = self.devices(group)
        if ps >= 0:
            return self._to_ps(devs, np.full(len(devs), nbytes), ps)
        counts, intra, inter, _ = self.shape(group)
        return float(self.sim.comm.allreduce(nbytes, counts, intra, inter))

    def shape(self, group: int) -> tuple:
        if group not in self._shape:
            self._shape[group] = allreduce_shape(self.sim, self.devices(group)[0])
        return self._shape[group]

    def _to_ps(self, devs: np.ndarray, nbytes: np.ndarray, ps: int) -> float:
        """Transfers to the PS queue per link and links run in parallel."""
        per_channel: dict[int, float] = {}
        for d, b in zip(devs.tolist(), nbytes.tolist()):
            if d != ps:
                ch = int(self.sim.dev_channel[d, ps])
                per_channel[ch] = per_channel.get(ch, 0.0) + transfer_time(b, float(self.sim.dev_bw[d, ps]),
                                                                           float(self.sim.channel_latency[ch]))
        return max(per_channel.values(), default=0.0)


# ---- the MILP ---------------------------------------------------------------------------


def _solve(sim: Simulator, sub: Subgraph, costs: _Costs, time_limit_s: float) -> Decision:
    import pulp

    ps = costs.ps_device(sub.variable)
    gop = sub.gradient_op
    name = sim.graph.ops[gop].name
    saved = costs.sync(float(sim.var_bytes[sim.var_index[sub.variable]]), sub.group, ps)
    compute = {i: max(costs.extra_compute(i, sub.group, ps), 0.0) for i in sub.ops}
    nbytes: dict[int, float] = {}  # batch tensors into the subgraph's ops, by producer
    for i in sub.ops:
        for e in sim.in_edges[i]:
            if sim.e_batch[e]:
                j = int(sim.e_src[e])
                nbytes[j] = max(nbytes.get(j, 0.0), float(sim.e_bytes[e]))
    gather = {j: costs.gather(size, sub.group, ps) for j, size in nbytes.items()}
    if saved <= _lower_bound(sim, sub, compute, gather):
        return Decision(sub.variable, name, "ruled_out", sync_saved_s=saved)

    problem = pulp.LpProblem("sfb", pulp.LpMinimize)
    x = {i: problem.add_variable(f"x{i}", cat="Binary") for i in sub.ops}
    b = {j: problem.add_variable(f"b{j}", cat="Binary") for j in gather}
    # A nanosecond per duplicated op: of equal plans, the one duplicating fewest ops (no free Reshapes).
    problem += (pulp.lpSum((compute[i] + 1e-9) * x[i] for i in sub.ops) + pulp.lpSum(gather[j] * b[j] for j in gather)
                - saved * x[gop])
    for i in sub.ops:
        for j in _batch_preds(sim, i):
            problem += b[j] >= x[i] - (x[j] if j in x else 0)
    for j, consumers in sub.partial_inputs.items():
        for i in consumers:
            problem += x[i] <= (x[j] if j in x else 0)
    start = time.perf_counter()
    problem.solve(_cbc(time_limit_s))
    elapsed = time.perf_counter() - start
    if (elapsed > time_limit_s or pulp.LpStatus[problem.status] != "Optimal"
            or problem.sol_status != pulp.LpSolutionOptimal):
        warnings.warn(f"SFB for {sub.variable}: the MILP did not finish within {time_limit_s:g} s "
                      f"({elapsed:.3f} s, {pulp.LpStatus[problem.status]}); its gradient stays synchronised",
                      stacklevel=2)
        return Decision(sub.variable, name, "timeout", sync_saved_s=saved, solve_s=elapsed)
    chosen = lambda var: (var.value() or 0.0) > 0.5  # noqa: E731 (a variable with no term has no value)
    duplicated = sorted(i for i in sub.ops if chosen(x[i]))
    gathered = sorted(j for j in gather if chosen(b[j]))
    if gop not in duplicated or saved <= sum(compute[i] for i in duplicated) + sum(gather[j] for j in gathered):
        return Decision(sub.variable, name, "no_gain", sync_saved_s=saved, solve_s=elapsed)
    return Decision(sub.variable, name, "sfb", duplicated, gathered, saved, sum(compute[i] for i in duplicated),
                    sum(gather[j] for j in gathered), elapsed)


def _lower_bound(sim: Simulator, sub: Subgraph, compute: dict[int, float], gather: dict[int, float]) -> float:
    """The least any SFB of the gradient costs (inf when none is possible): its op runs on the whole batch,
    each batch input of a duplicated op is gathered or duplicated in turn, and each partial-sum input is
    duplicated (from outside the subgraph it cannot be). Two valid bounds, the larger kept: the dearest
    input followed all the way up, and the gradient op's distinct inputs one level up, summed (deeper,
    two inputs may share an ancestor, which a sum would count twice)."""
    partial: dict[int, list[int]] = {}
    for j, consumers in sub.partial_inputs.items():
        for i in consumers:
            partial.setdefault(i, []).append(j)
    memo: dict[int, float] = {}

    def needs(i: int) -> dict[int, tuple[float, float]]:
        """Per input op: (direct cost, cost followed up) that a duplicated op i needs of it."""
        out = {j: ((min(gather[j], compute[j]), min(gather[j], compute[j] + inputs(j))) if j in compute
                   else (gather[j], gather[j])) for j in _batch_preds(sim, i)}
        for j in partial.get(i, []):  # a partial sum cannot be gathered: it is duplicated too
            out[j] = (compute[j], compute[j] + inputs(j)) if j in compute else (math.inf, math.inf)
        return out

    def inputs(i: int) -> float:
        if i not in memo:
            memo[i] = max((up for _, up in needs(i).values()), default=0.0)
        return memo[i]

    gop = sub.gradient_op
    return compute[gop] + max(inputs(gop), sum(direct for direct, _ in needs(gop).values()))


def _cbc(time_limit_s: float):
    """The CBC binary that ships inside pulp (PuLP 3 marks its wrapper deprecated; PuLP 4 is not pinned)."""
    import pulp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=max(time_limit_s, 1e-3))


def _batch_preds(sim: Simulator, op: int) -> list[int]:
    return [int(sim.e_src[e]) for e in sim.in_edges[op] if sim.e_batch[e]]
