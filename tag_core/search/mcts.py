"""MCTS over per-group (placement mask, option) decisions, scored by the simulator.

The tree decides the op groups one at a time in `decision_order`: largest share of the
step's compute plus share of the synchronised gradient bytes first, so depth d chooses
the action of group `order[d]`. (The TAG authors decide by compute alone; a group with
little compute but a large gradient, such as a classifier's weights, then comes at a
depth a budget of a few hundred iterations never reaches.) There are no
random rollouts: a new node is scored by simulating its strategy with every
undecided group on a default action — the action chosen at the root (so the root's
children are the uniform plans), or model-parallel on every machine while the search is in
out-of-memory mode (see `MctsConfig.default`).

Action space (`ActionSpace`): placement masks over machines × the four OPTIONS.
Masks stay few so that the tree stays shallow-wide rather than exponential:
  - every machine;
  - each single machine (the `MAX_SINGLES` fastest when there are many);
  - the machines of each GPU type;
  - the k fastest machines (by summed device speed) for k = 2 .. M-1, k thinned
    geometrically when M is large;
  - on racks, each rack's and each pod's machines (the MAX_SINGLES fastest of each), so
    that gradient sync can stay under an oversubscribed uplink;
  - any extra mask a warm-start plan used.
Beyond PER_MACHINE_UP_TO (16) machines the masks are over machine classes instead
(tag_core/cluster/classes.py, `ActionSpace.by_class`): k machines of a class for
k = 1, n^(1/3), n^(2/3), n (the MAX_SINGLES fastest classes), each GPU type, the j fastest
classes whole, and the k fastest machines; a class's k machines are its first k, packed by
rack. So the space, and the tree's width, grow with the kinds of machine, not the machines.
A model-parallel action splits the group's ops over the mask's devices with METIS
(`Evaluator._split`, the largest part on the fastest device). Duplicates are dropped: testbed.json (7 machines, 3 types) gets 15 masks, 60 actions;
cloud.json (6 machines, 2 types) 12 masks, 48 actions.

Selection is PUCT, `q + c·p·sqrt(N)/(1+n)` with `c = sqrt(actions/10)` (the TAG
authors' choice), where q is the child's mean reward min-max normalised over the
rewards seen so far (so c is scale-free) and an unvisited child counts its parent's q
(first-play urgency). Priors p come from a `prior` hook: a callable that takes the
`SearchState` of the node being expanded and returns a probability per action for the
next group (uniform when None; the GNN plugs in here). Ties break by a seeded RNG, so
a search is deterministic for a seed (and a budget in iterations).

Reward: `baseline/time - 1`, -1 on out-of-memory; the baseline is DP-NCCL's time (the
feasible default plan's time when DP-NCCL runs out of memory). Simulation results are
cached by action vector, so `simulations` counts distinct strategies only.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tag_core.simulate.result import SimResult
from tag_core.simulate.strategy import Strategy

from .space import (  # noqa: F401  (re-exported: the planner API lives here)
    ALLREDUCE,
    MAX_SINGLES,
    MODEL_PARALLEL,
    ActionSpace,
    Evaluator,
    Score,
    reward,
    subgraph,
)

# ---- search --------------------------------------------------------------------


@dataclass(frozen=True)
class SearchState:
    """What a prior hook sees: the node at `depth` that chooses the action of group `group`."""

    depth: int
    group: int  # the group this node decides (groups are decided in `Mcts.order`)
    decided: tuple[int, ...]  # actions of the groups decided so far, in decision order
    decided_groups: tuple[int, ...]  # those groups
    actions: np.ndarray  # the node's full action vector per group, as scored (undecided on the default)
    evaluator: Evaluator

    def strategy(self) -> Strategy:
        return self.evaluator.strategy(self.actions)

    def sim_result(self) -> SimResult:
        return self.evaluator.result(self.actions)


Prior = Callable[[SearchState], np.ndarray]


@dataclass(frozen=True)
class Budget:
    iterations: int | None = None
    seconds: float | None = None
    simulations: int | None = None  # distinct strategies simulated (MCMC's natural unit)

    def done(self, iterations: int, simulations: int, elapsed: float) -> bool:
        return ((self.iterations is not None and iterations >= self.iterations)
                or (self.seconds is not None and elapsed >= self.seconds)
                or (self.simulations is not None and simulations >= self.simulations))

    def to_dict(self) -> dict:
        return {k: v for k, v in (("iterations", self.iterations), ("seconds", self.seconds),
                                  ("simulations", self.simulations)) if v is not None}


@dataclass
class SearchResult:
    actions: np.ndarray
    time_s: float
    oom: bool
    iterations: int
    simulations: int
    wall_s: float
    first_better_than_dp_iteration: int | None
    trace: list[tuple[int, int, float]] = field(default_factory=list)  # (iteration, simulations, best) per improvement

    def best_at(self, simulations: int) -> float:
        """Best time found within the first `simulations` simulations (inf if none)."""
        found = [t for _, s, t in self.trace if s <= simulations]
        return min(found) if found else math.inf


class _Best:
    """Best feasible plan seen, and when it first beat DP-NCCL."""

    def __init__(self, dp_time_s: float):
        self.dp = dp_time_s
        self.actions: np.ndarray | None = None
        self.score = Score(math.inf, True)
        self.first_better: int | None = None
        self.trace: list[tuple[int, int, float]] = []

    def offer(self, actions: np.ndarray, score: Score, iteration: int, simulations: int) -> None:
        better = (score.oom, score.time_s) < (self.score.oom, self.score.time_s)
        if self.actions is None or better:
            self.actions, self.score = actions.copy(), score
            if not score.oom:
                self.trace.append((iteration, simulations, score.time_s))
                if self.first_better is None and score.time_s < self.dp:
                    self.first_better = iteration

    def result(self, iterations: int, simulations: int, wall: float) -> SearchResult:
        return SearchResult(self.actions, self.score.time_s, self.score.oom, iterations, simulations, wall,
                            self.first_better, self.trace)


@dataclass
class _Node:
    prior: np.ndarray | None = None
    visits: np.ndarray | None = None  # per action
    total: np.ndarray | None = None  # summed reward per action
    children: dict[int, "_Node"] = field(default_factory=dict)
    n: int = 0
    w: float = 0.0


@dataclass
class MctsConfig:
    default: int = -1  # action of undecided groups; -1: the root's choice
    c_scale: float = 1.0  # multiplies c = sqrt(actions/10)


def decision_order(evaluator: Evaluator) -> np.ndarray:
    """Group indices, the group with the largest share of compute plus share of synchronised
    gradient bytes first (see the module docstring); ties keep index order (compute first)."""
    sim, groups = evaluator.sim, evaluator.groups
    G = groups.num_groups
    compute = np.bincount(groups.assignment, weights=sim.ref_time, minlength=G)
    per_op = np.zeros(sim.n)
    np.add.at(per_op, sim.sync_grad_op, sim.sync_bytes)
    synced = np.bincount(groups.assignment, weights=per_op, minlength=G)
    share = compute / max(compute.sum(), 1e-30) + synced / max(synced.sum(), 1e-30)
    return np.argsort(-share, kind="stable")


class Mcts:
    """The search. `order` is the order groups are decided in (default: `decision_order`);
    another order lets a caller decide other groups first without renumbering them."""

    def __init__(self, evaluator: Evaluator, baseline_s: float, dp_time_s: float, seed: int = 0,
                 prior: Prior | None = None, config: MctsConfig | None = None, order: np.ndarray | None = None):
        self.ev, self.baseline, self.prior_fn = evaluator, baseline_s, prior
        self.cfg = config or MctsConfig()
        self.G, self.K = evaluator.groups.num_groups, evaluator.space.size
        self.order = decision_order(evaluator) if order is None else np.asarray(order, dtype=np.int64)
        if sorted(self.order.tolist()) != list(range(self.G)):
            raise ValueError("order must be a permutation of the group indices")
        self.rng = np.random.default_rng(seed)
        self.root = _Node()
        self.best = _Best(dp_time_s)
        self.lo, self.hi = math.inf, -math.inf  # feasible rewards seen, for normalising q
        self.iterations = 0

    def _fill(self, path: list[int]) -> np.ndarray:
        fill = path[0] if path and self.cfg.default < 0 else self.cfg.default
        if fill < 0:
            fill = self.ev.space.all_machines
        out = np.full(self.G, fill, dtype=np.int64)
        out[self.order[: len(path)]] = path
        return out

    def _priors(self, node: _Node, path: list[int]) -> None:
        if self.prior_fn is None:
            p = np.full(self.K, 1.0 / self.K)
        else:
            group = int(self.order[len(path)]) if len(path) < self.G else -1
            state = SearchState(len(path), group, tuple(path), tuple(self.order[: len(path)].tolist()),
                                self._fill(path), self.ev)
            p = check_prior(self.prior_fn(state), self.K)
        node.prior, node.visits, node.total = p, np.zeros(self.K), np.zeros(self.K)

    def _select(self, node: _Node) -> int:
        span = self.hi - self.lo
        norm = (lambda v: (v - self.lo) / span) if span > 1e-12 else (lambda v: np.zeros_like(v) + 0.5)
        parent_q = norm(node.w / node.n) if node.n else 0.5
        q = np.where(node.visits > 0, norm(node.total / np.maximum(node.visits, 1)), parent_q)
        c = math.sqrt(self.K / 10.0) * self.cfg.c_scale
        score = q + c * node.prior * math.sqrt(max(node.n, 1)) / (1.0 + node.visits)
        ties = np.flatnonzero(score >= score.max() - 1e-12)
        return int(ties[0] if len(ties) == 1 else self.rng.choice(ties))

    def _leaf(self, path: list[int]) -> float:
        actions = self._fill(path)
        score = self.ev.score(actions)
        self.best.offer(actions, score, self.iterations, self.ev.simulations)
        r = reward(score, self.baseline)
        if not score.oom:
            self.lo, self.hi = min(self.lo, r), max(self.hi, r)
        return r

    @staticmethod
    def _backup(nodes: list[_Node], path: list[int], r: float) -> None:
        for node in nodes:  # the root, then one node per action on the path
            node.n += 1
            node.w += r
        for node, a in zip(nodes, path):
            node.visits[a] += 1
            node.total[a] += r

    def iterate(self) -> None:
        """Select down to an unvisited action (or a full plan), score it, back the reward up."""
        self.iterations += 1
        node, nodes, path = self.root, [self.root], []
        while len(path) < self.G:
            if node.prior is None:
                self._priors(node, path)
            a = self._select(node)
            path.append(a)
            fresh = node.visits[a] == 0
            node = node.children.setdefault(a, _Node())
            nodes.append(node)
            if fresh:
                break
        self._backup(nodes, path, self._leaf(path))

    def seed_path(self, actions: np.ndarray) -> None:
        """Warm start: walk a known plan's actions into the tree and score it once."""
        self.iterations += 1
        node, nodes, path = self.root, [self.root], []
        for a in np.asarray(actions, dtype=np.int64)[self.order].tolist():
            if node.prior is None:
                self._priors(node, path)
            path.append(a)
            node = node.children.setdefault(a, _Node())
            nodes.append(node)
        # Score the full vector (not the default-filled prefix) so the plan itself is the incumbent.
        score = self.ev.score(np.asarray(actions, dtype=np.int64))
        self.best.offer(np.asarray(actions, dtype=np.int64), score, self.iterations, self.ev.simulations)
        r = reward(score, self.baseline)
        if not score.oom:
            self.lo, self.hi = min(self.lo, r), max(self.hi, r)
        self._backup(nodes, path, r)

    def run(self, budget: Budget, progress: Callable[[int, SearchResult], None] | None = None) -> SearchResult:
        start = time.perf_counter()
        while not budget.done(self.iterations, self.ev.simulations, time.perf_counter() - start):
            self.iterate()
            if progress is not None:
                progress(self.iterations, self.result(time.perf_counter() - start))
        return self.result(time.perf_counter() - start)

    def result(self, wall: float) -> SearchResult:
        return self.best.result(self.iterations, self.ev.simulations, wall)

    def visit_counts(self, path: tuple[int, ...] = ()) -> np.ndarray:
        """Visits per action below the node at `path` (policy targets for the GNN)."""
        node = self.root
        for a in path:
            node = node.children[a]
        return node.visits.copy() if node.visits is not None else np.zeros(self.K)


def check_prior(p: object, size: int) -> np.ndarray:
    """A prior hook's output as a probability vector; anything else is a bug in the hook."""
    arr = np.asarray(p, dtype=np.float64)
    if arr.shape != (size,):
        raise ValueError(f"prior returned shape {arr.shape}, expected ({size},): one probability per action")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0) or arr.sum() <= 0:
        raise ValueError("prior must return finite, non-negative probabilities with a positive sum")
    return arr / arr.sum()
