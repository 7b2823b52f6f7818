"""`plan(...)`: op groups, baselines, strategy-wide settings, MCTS, the MCMC baseline,
the ideal time and the plan JSON, in one call.

Steps:
1. Simulator for (graph, topology, profiles, batch); DP-NCCL, DP-NCCL-P and Horovod.
2. METIS op groups (`make_groups`, unless given: the `op_groups` asset passes its own).
3. Strategy-wide settings, fixed before the search because they apply to every group:
   batch shares (device speed, as DP-NCCL-P; equal; or whole rows balanced by the compute model when
   that split differs) × gradient fusion (none, or Horovod's 64 MiB buckets) × gradient sync
   overlapping the backward pass or not, picked by simulating the all-machines AllReduce plan under
   each, a batch split also by the all-machines PS plan. They include DP-NCCL, DP-NCCL-P and Horovod
   themselves, so the search starts from the best of them.
   If all of them run out of memory the search runs in out-of-memory mode: undecided
   groups default to the first plan that fits of model-parallel on every machine, then
   each mask of the space replicated or model-parallel. If none fits, the model fits no
   device set: TagInputError with the memory needed against the cluster's.
4. MCTS (search/mcts.py) from the all-machines default (and a warm-start plan when given). With a
   prior, the best uniform plan (one action for every group) is an incumbent too: a confident
   prior narrows the root and can pass over the uniform plan that wins (PS everywhere, one
   machine), which uniform priors try in their first sweep; one simulation per action.
5. MCMC (search/mcmc.py) with as many simulations as MCTS used, from the same default.
6. Sufficient Factor Broadcasting (sfb/milp.py): a MILP per synchronised gradient, kept where the
   simulated step gets faster, on MCTS's plan, the replicate-everything default under each setting
   of step 3 (DP-NCCL and Horovod among them), the best uniform plan MCTS scored, and MCTS's plan
   under the other settings; the fastest is the plan (`sfb=False` skips this step). MILPs
   and trial runs stop at the deadline (sfb_step.py), taking the candidates in that order.
7. ideal time: the step's compute, perfectly balanced over every device, no
   communication: 1 / sum_d (1 / T_d) with T_d the whole step at full batch on device d.
8. One device: when the fastest single device that fits is no slower than the plan, as it may be for a
   tiny model on loopback, the plan is `single` and says why (the honest answer). With `measured_error`
   (plan/measured_error.py), also when that error could take the plan's predicted gain away.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tag_core import __version__
from tag_core.capture.graph import OpGraph
from tag_core.cluster.gpu_catalog import CATALOG, lookup_gpu
from tag_core.cluster.topology import Topology
from tag_core.errors import TagInputError
from tag_core.fusion.cost import FusedComputeModel
from tag_core.fusion.patterns import FusionPlan
from tag_core.search.baselines import HOROVOD_FUSION_BYTES, device_speed, run_baselines
from tag_core.search.grouping import DEFAULT_GROUPS, OpGroups, group_ops
from tag_core.search.mcmc import mcmc_search
from tag_core.search.mcts import (
    MODEL_PARALLEL,
    ActionSpace,
    Budget,
    Evaluator,
    Mcts,
    MctsConfig,
    Prior,
    Score,
    SearchResult,
)
from tag_core.sfb.milp import DEFAULT_TIME_LIMIT_S
from tag_core.simulate.batch_rows import balanced_shares, split_batch
from tag_core.simulate.comm import CommModel
from tag_core.simulate.simulator import Simulator
from tag_core.simulate.stopwatch import Stopwatch
from tag_core.simulate.strategy import OPTIONS, Strategy

from .deadline import Deadline
from .measured_error import MeasuredError
from .one_device import one_device_instead
from .progress import search_progress, spinner
from .sfb_step import sfb_candidates, sfb_plan_candidates
from .warm_start import warm_start_actions

DEFAULT_ITERATIONS = 300
BASELINE_NAMES = ("dp-nccl", "dp-nccl-p", "horovod")
# Source files whose behaviour a plan depends on: their hash is the plan's code version.
_CODE_FILES = ("plan/planner.py", "search/mcts.py", "search/mcmc.py", "simulate/simulator.py", "simulate/engine.py",
               "simulate/expand.py", "simulate/cost.py", "simulate/strategy.py", "search/grouping.py",
               "search/baselines.py", "sfb/milp.py", "simulate/comm.py", "search/space.py", "simulate/slots.py",
               "simulate/memory.py", "simulate/reshard.py", "cluster/classes.py")


def code_version() -> str:
    digest = hashlib.sha256()
    here = Path(__file__).parents[1]  # tag_core
    for name in _CODE_FILES:
        digest.update((here / name).read_bytes())
    return f"{__version__}+{digest.hexdigest()[:12]}"


def reference_op_times_us(graph: OpGraph, profiles: pd.DataFrame | None) -> np.ndarray:
    """Per-op µs on the first profiled device type (else a V100) at the graph's batch: METIS's weights.

    Topology-independent on purpose, so the model-partitioned `op_groups` asset and
    `tag plan` make the same groups.
    """
    from tag_core.simulate.cost import ComputeModel

    compute = ComputeModel(graph, profiles)
    types = compute.profiled_types
    try:
        gpu = lookup_gpu(types[0]) if types else CATALOG["V100-16GB"]
    except TagInputError:
        gpu = CATALOG["V100-16GB"]
    return compute.times(gpu, graph.batch_size) * 1e6


def make_groups(graph: OpGraph, profiles: pd.DataFrame | None, num_groups: int = DEFAULT_GROUPS,
                seed: int = 0) -> OpGroups:
    return group_ops(graph, reference_op_times_us(graph, profiles), num_groups, seed)


def profile_batch_sizes(batch_size: int, topology: Topology) -> list[int]:
    """Per-device batches worth profiling: divisors of the global batch nearest to
    batch / (all devices) and batch / (devices of the largest machine)."""
    small = [d for d in range(1, math.isqrt(batch_size) + 1) if batch_size % d == 0]  # O(sqrt): batches can be huge
    divisors = sorted({*small, *(batch_size // d for d in small)})
    largest = max(m.count for m in topology.machines)
    wanted = {batch_size / topology.num_devices, batch_size / largest}
    return sorted({min(divisors, key=lambda d: (abs(d - w), d)) for w in wanted})


def ideal_time_s(sim: Simulator) -> float:
    # Per GPU type, not per device (8192 devices, three types): the same sum, added in device order.
    types, first = np.unique(sim.dev_gpu_id, return_index=True)
    step = {int(t): float(sim.compute.times(sim.dev_gpu[int(d)], sim.batch).sum()) for t, d in zip(types, first)}
    rates = np.array([1.0 / max(step[t], 1e-12) for t in types.tolist()])[np.searchsorted(types, sim.dev_gpu_id)]
    rate = 0.0
    for r in rates.tolist():  # sequentially, as before: a pairwise sum would round differently
        rate += r
    return 1.0 / rate


@dataclass
class Plan:
    """Everything `tag plan` reports; `to_dict()` is the plan JSON."""

    model: str
    topology: Topology
    batch_size: int
    groups: OpGroups
    strategy: Strategy
    tag: SearchResult
    baselines: dict[str, float]  # name -> iteration time (s); dp_nccl, dp_nccl_p, horovod, mcmc
    baseline_oom: dict[str, bool]
    ideal_s: float
    oom: bool
    peak_memory_bytes: list[float]
    search_wall_s: float
    simulations: int
    lineage: dict[str, Any]
    settings: dict[str, Any]
    mcmc: SearchResult | None = None
    actions: list[str] = field(default_factory=list)  # per group, "mask/option"
    evaluator: Evaluator | None = field(default=None, repr=False)  # the search's (for benchmarks)
    start: np.ndarray | None = field(default=None, repr=False)  # the default plan both searches began from
    fusion: dict[str, Any] | None = None  # the fusion plan the costs assumed: patterns, ops_fused, kernels
    sfb: dict[str, Any] | None = None  # SfbResult.to_dict(): the gradients rebuilt from factors, solve times
    calibration: dict[str, Any] = field(default_factory=dict)  # applied (hash, uncalibrated time) or why not
    one_device: dict[str, Any] | None = None  # the plan is `single`: its time, device and why (step 8)
    computing_devices: int | None = None  # devices with work in the plan (a split gives replicas whole rows)

    @property
    def time_s(self) -> float:
        """The plan's simulated iteration time: one device's when that won, else MCTS's strategy, with SFB where
        it was kept."""
        if self.one_device:
            return self.one_device["iteration_time_s"]
        return self.sfb["iteration_time_s"] if self.sfb else self.tag.time_s

    def to_dict(self) -> dict[str, Any]:
        dp = self.baselines["dp_nccl"]
        return {
            "model": self.model,
            "topology": self.topology.name,
            # The plan travels alone: `tag plans import` and `tag emit` need no topology file.
            "topology_snapshot": {"hash": self.topology.content_hash(), "snapshot": self.topology.to_dict()},
            "batch_size": self.batch_size,
            "groups": self.groups.num_groups,
            "strategy": self.strategy.to_dict(),
            "tag": {"iteration_time_s": self.time_s, "iteration_time_s_without_sfb": self.tag.time_s,
                    "actions": self.actions, "peak_memory_bytes": self.peak_memory_bytes, "settings": self.settings,
                    "computing_devices": self.computing_devices},
            "baselines": {k: {"iteration_time_s": v, "oom": self.baseline_oom.get(k, False)}
                          for k, v in self.baselines.items()},
            "speedup_vs_dp_nccl": dp / self.time_s if not self.baseline_oom.get("dp_nccl") else None,
            "ideal_time_s": self.ideal_s,
            "oom": self.oom,
            "search": {"iterations": self.tag.iterations, "simulations": self.simulations,
                       "wall_s": self.search_wall_s,
                       "first_better_than_dp_iteration": self.tag.first_better_than_dp_iteration},
            "lineage": self.lineage,
            **({"fusion": self.fusion} if self.fusion is not None else {}),
            **({"sfb": self.sfb} if self.sfb is not None else {}),
            "calibration": self.calibration,
            **({"one_device": self.one_device} if self.one_device is not None else {}),
        }


def plan(
    graph: OpGraph,
    topology: Topology,
    profiles: pd.DataFrame | None,
    *,
    batch_size: int | None = None,
    num_groups: int = DEFAULT_GROUPS,
    groups: OpGroups | None = None,
    budget: Budget | None = None,
    seed: int = 0,
    prior: Prior | None = None,
    warm_start: dict | Strategy | None = None,
    mcmc_simulations: int | None = None,
    profile_hash: str | None = None,
    lineage: dict[str, Any] | None = None,
    show_progress: bool = False,
    fusion: FusionPlan | None = None,
    sfb: bool = True,
    sfb_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    comm: CommModel | None = None,
    uncalibrated_because: str | None = None,
    measured_error: MeasuredError | None = None,
) -> Plan:
    """Search a plan for `graph` on `topology`; see the module docstring for the steps.

    With `fusion`, every op time (TAG's and the baselines') is the fused cost. With a calibrated `comm`,
    communication costs what the calibration measured, and the plan also reports its time under the
    defaults; without one, `uncalibrated_because` says why (it goes into the plan JSON). `measured_error`: how
    far predictions were from measured steps on this topology (step 8).
    """
    budget = budget or Budget(iterations=DEFAULT_ITERATIONS)
    start = time.perf_counter()
    deadline = Deadline.starting_now(budget, sfb)
    with spinner("set-up: simulator, baselines, op groups and settings", show_progress):
        compute = FusedComputeModel(graph, profiles, fusion) if fusion is not None else None
        sim = Simulator(graph, topology, profiles, batch_size=batch_size, compute=compute, comm=comm)
        base = {name.replace("-", "_"): result for name, (_, result) in run_baselines(sim, BASELINE_NAMES).items()}
        dp = base["dp_nccl"]
        groups = groups if groups is not None else make_groups(graph, profiles, num_groups)
        if len(groups.assignment) != sim.n:
            raise TagInputError("groups", f"cover {len(groups.assignment)} ops but the graph has {sim.n}")
        speed = device_speed(sim)
        space = ActionSpace.build(sim, speed)
        warm = warm_start_actions(warm_start, graph, topology, groups, space) if warm_start is not None else None
        settings_watch = Stopwatch()  # numba's first compiling is no simulation's cost
        ev, setup_sims, default, settings = _settings(sim, groups, space, speed, deadline)
        deadline.hold_back(settings_watch.seconds() / max(setup_sims + ev.simulations, 1))
    baseline_s = dp.iteration_time_s if not dp.oom else ev.score(np.full(groups.num_groups, default)).time_s
    cfg = MctsConfig(default=-1 if default == space.all_machines else default)
    search = Mcts(ev, baseline_s, dp.iteration_time_s, seed=seed, prior=prior, config=cfg)
    search.seed_path(np.full(groups.num_groups, default))  # the default plan is the first incumbent
    if prior is not None:
        uniform = _best_uniform_plan(ev, groups.num_groups, deadline)
        if uniform is not None and uniform[0] != default:
            search.seed_path(uniform)
    if warm is not None:
        search.seed_path(warm)
    search_budget = deadline.search_budget(budget)
    searched_from, search_watch = ev.simulations, Stopwatch()
    with search_progress(f"plan {graph.model}", search_budget, show_progress) as bar:
        tag = search.run(search_budget, progress=bar)
    if ev.simulations > searched_from:  # the search's plans are dearer to simulate than the set-up's uniform ones
        per_simulation = search_watch.seconds() / (ev.simulations - searched_from)
        deadline.hold_back(max(deadline.seconds_per_simulation, per_simulation))
    tag.simulations += setup_sims
    deadline.slowest_s = ev.slowest_s
    mcmc_ev = Evaluator(sim, groups, space, ev.shares, ev.fusion_bytes, ev.overlap, speed=speed)
    mcmc_budget = deadline.mcmc_budget(mcmc_simulations or max(ev.simulations, 1))
    with spinner("MCMC, the comparison search", show_progress):
        mcmc = (_unmoved(ev, np.full(groups.num_groups, default)) if mcmc_budget.seconds == 0 else
                mcmc_search(mcmc_ev, np.full(groups.num_groups, default), mcmc_budget, dp.iteration_time_s, seed=seed))
    chosen, sfb_report = tag.actions, None
    strategy = ev.strategy(chosen)
    if sfb:
        with spinner("SFB: a MILP per synchronised gradient", show_progress):
            candidates = sfb_plan_candidates(tag.actions, ev, settings, default,
                                             list(_setting_evaluators(sim, groups, space, speed)))
            chosen, sfb_settings, decided, applied_to = sfb_candidates(sim, groups, candidates, sfb_time_limit_s,
                                                                       deadline)
        sfb_report = {**decided.to_dict(sim), "applied_to": applied_to}
        strategy, settings = decided.strategy, sfb_settings
    strategy.extra = {"machines": [m.name for m in topology.machines]}
    final = sim.run(strategy)
    one_device = one_device_instead(sim, final, dp, measured_error)
    if one_device is not None:
        strategy, final = one_device.pop("strategy"), one_device.pop("result")
    if sim.comm.calibrated:
        defaults = Simulator(graph, topology, profiles, batch_size=batch_size, compute=sim.compute)
        calibration = {"applied": True, "hash": sim.comm.calibration_hash,
                       "uncalibrated_time_s": float(defaults.run(strategy).iteration_time_s)}
    else:
        calibration = {"applied": False, "why": uncalibrated_because or "none given: the cost model's defaults"}
    if measured_error is not None:
        calibration["measured_error"] = measured_error.to_dict()
    times = {k: float(r.iteration_time_s) for k, r in base.items()}
    times["mcmc"] = mcmc.time_s
    oom = {k: bool(r.oom) for k, r in base.items()}
    oom["mcmc"] = mcmc.oom
    return Plan(
        model=graph.model, topology=topology, batch_size=sim.batch, groups=groups, strategy=strategy, tag=tag,
        baselines=times, baseline_oom=oom, ideal_s=ideal_time_s(sim), oom=bool(final.oom),
        peak_memory_bytes=[float(x) for x in final.peak_memory_bytes],
        search_wall_s=time.perf_counter() - start, simulations=tag.simulations,
        lineage={"graph_hash": graph.content_hash(), "profile_hash": profile_hash,
                 "groups_hash": groups.content_hash(), "topology_hash": topology.content_hash(),
                 "code_version": code_version(), "seed": seed, "budget": budget.to_dict(),
                 "checkpoint": None, "calibration": sim.comm.calibration_hash, **(lineage or {})},
        settings=settings, mcmc=mcmc, actions=[space.describe(int(a)) for a in chosen],
        evaluator=ev, start=np.full(groups.num_groups, default),
        fusion=None if fusion is None else {"patterns": len(fusion.patterns), "ops_fused": fusion.ops_fused,
                                            "kernels_before": fusion.kernels_before,
                                            "kernels_after": fusion.kernels_after},
        sfb=sfb_report, calibration=calibration, one_device=one_device,
        computing_devices=int((final.busy_s > 0).sum()),
    )


def _unmoved(ev: Evaluator, start: np.ndarray) -> SearchResult:
    """MCMC when the deadline left it no time: its start, which the search scored first (no simulation)."""
    score = ev.score(start)
    return SearchResult(start, score.time_s, score.oom, iterations=0, simulations=0, wall_s=0.0,
                        first_better_than_dp_iteration=None)


def _settings(sim: Simulator, groups: OpGroups, space: ActionSpace, speed: np.ndarray,
              deadline: Deadline | None = None) -> tuple[Evaluator, int, int, dict[str, Any]]:
    """(evaluator, simulations spent, default action, settings) — see step 3 of the module docstring. Past
    the deadline (if any) the settings tried so far (the first at least) decide."""
    G = groups.num_groups
    allreduce = space.all_machines
    ps = allreduce - OPTIONS.index("allreduce") + OPTIONS.index("ps")
    tried: list[tuple[tuple[bool, float], Evaluator, dict]] = []
    on_ps: dict[bytes, Score] = {}  # per distinct split of the batch over every device
    for settings, ev in _setting_evaluators(sim, groups, space, speed):
        if tried and deadline is not None and deadline.passed():
            break
        score = ev.score(np.full(G, allreduce))
        time_s = score.time_s
        # A batch split is judged by PS on every machine too (once per split: buckets are AllReduce's), as
        # the plan may well be PS: a split that evens out the replicas' optimizer steps can misjudge it.
        if _probes_ps(settings):
            rows = split_batch(sim.batch, ev.shares, speed).tobytes()
            if rows not in on_ps:  # on thousands of GPUs a PS everywhere takes seconds to simulate
                on_ps[rows] = ev.score(np.full(G, ps))
            time_s = min(time_s, np.inf if on_ps[rows].oom else on_ps[rows].time_s)
        tried.append(((score.oom, time_s), ev, settings))
    key, ev, settings = min(tried, key=lambda t: t[0])
    if _probes_ps(settings):  # its PS probe may have run under another split alike: the chosen evaluator
        ev.score(np.full(G, ps))  # holds it too, so SFB sees it (Evaluator.best_uniform)
    spent = sum(t[1].simulations for t in tried) - ev.simulations  # the chosen evaluator counts its own
    if not key[0]:  # the search's default stays AllReduce everywhere (it fits): MCTS moves groups away from it
        return ev, spent, allreduce, {**settings, "out_of_memory_mode": False}
    spent += ev.simulations
    # Out of memory everywhere: model-parallel on every machine first, then each mask of the
    # space (smaller sets hold fewer replicas) replicated and model-parallel, until one fits.
    ev = Evaluator(sim, groups, space, speed / speed.sum(), fusion_bytes=0, overlap=True, speed=speed)
    k = len(OPTIONS)
    mp_all = allreduce - OPTIONS.index("allreduce") + MODEL_PARALLEL
    candidates = [mp_all] + [m * k + o for m in range(len(space.masks)) for o in (OPTIONS.index("allreduce"),
                                                                                 MODEL_PARALLEL)]
    for action in dict.fromkeys(candidates):
        score: Score = ev.score(np.full(G, action))
        if not score.oom:
            return ev, spent, action, {"batch_shares": "speed", "fusion_bytes": 0, "overlap": True,
                                       "out_of_memory_mode": True}
    _does_not_fit(sim, ev.result(np.full(G, mp_all)))


def _best_uniform_plan(ev: Evaluator, num_groups: int, deadline: Deadline) -> np.ndarray | None:
    """The best plan with one action for every group, among those scored while the deadline leaves the
    search time (None if none was): one simulation per action, hundreds on a large space."""
    best: tuple[tuple[bool, float], np.ndarray] | None = None
    for a in range(ev.space.size):
        if not deadline.searching_allowed():
            break
        actions = np.full(num_groups, a)
        score = ev.score(actions)
        if best is None or (score.oom, score.time_s) < best[0]:
            best = ((score.oom, score.time_s), actions)
    return None if best is None else best[1]


def _probes_ps(settings: dict) -> bool:
    """The one setting per batch split that also scores PS on every machine (buckets are AllReduce's)."""
    return settings["fusion_bytes"] == 0 and settings["overlap"]


def _setting_evaluators(sim: Simulator, groups: OpGroups, space: ActionSpace, speed: np.ndarray):
    """(settings, evaluator) for each strategy-wide setting: shares × gradient fusion × overlap."""
    for shares_name, shares in _batch_shares(sim, speed):
        for fusion in (0, HOROVOD_FUSION_BYTES):
            for overlap in (True, False):
                yield ({"batch_shares": shares_name, "fusion_bytes": fusion, "overlap": overlap},
                       Evaluator(sim, groups, space, shares, fusion_bytes=fusion, overlap=overlap, speed=speed))


def _batch_shares(sim: Simulator, speed: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """By device speed (as DP-NCCL-P), equal, and balanced (whole rows that even out the replicas' compute,
    batch_rows.py) where that split exists and differs from both."""
    out = [("speed", speed / speed.sum()), ("equal", np.ones(sim.num_devices))]
    balanced = balanced_shares(sim, speed)
    if balanced is not None:
        rows = split_batch(sim.batch, balanced, speed)
        if not any(np.array_equal(rows, split_batch(sim.batch, s, speed)) for _, s in out):
            out.append(("balanced", balanced))
    return out


def _does_not_fit(sim: Simulator, result) -> None:
    gb = 1e9
    params = float(sim.var_bytes.sum())
    acts = float(sim.act_bytes.sum())
    worst = int(np.argmax(result.peak_memory_bytes / result.memory_capacity_bytes))
    raise TagInputError(
        "model",
        f"{sim.graph.model} at batch {sim.batch} fits no device set, even model-parallel on all "
        f"{sim.num_devices} devices or on any machine set: it needs about {(params + acts) / gb:.2f} GB "
        f"(variables and optimizer state {params / gb:.2f} GB, activations {acts / gb:.2f} GB); the cluster has {sim.capacity.sum() / gb:.2f} GB "
        f"in all, and device {worst} would need {result.peak_memory_bytes[worst] / gb:.2f} GB "
        f"of its {result.memory_capacity_bytes[worst] / gb:.2f} GB",
    )
