"""AlphaZero-style training of the policy network on MCTS visit counts.

One generation:
1. `episodes` searches. Each draws a model and a training topology (random_topology
   seed in [0, topologies)) and settings ("dp" or "planner", see problems.py), then runs
   MCTS for `iterations` iterations with the current network as its prior (Dirichlet
   noise mixed into the root's prior, as AlphaZero does, so the search explores).
2. Every tree node visited at least `min_visits` times becomes an example: the state's
   graph (recorded when the prior hook featurized it) and its children's visit counts,
   normalised, as the policy target.
3. `epochs` passes of Adam over the generation's examples, loss = cross-entropy between
   the targets and the network's log-probabilities.
4. The checkpoint (weights, Adam state, curve) is written to `out`.
Before step 3 the network's top-1 agreement with the new targets is measured: they are
data it has not been trained on, so the curve shows generalisation, not memory.

Deterministic for a seed: every episode's draws, MCTS seed and noise, and every
generation's shuffling derive from (seed, generation, episode); torch runs on one thread.
`generations` bounds the run exactly; `minutes` stops at the first generation boundary
past the time (so a time-bounded run is a prefix of the same sequence). `resume`
continues from a checkpoint's generation count, weights and Adam state: resuming after
n generations gives the same weights as running n + m generations in one go.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from tag_core.cluster.topology import random_topology
from tag_core.errors import TagInputError
from tag_core.search.grouping import DEFAULT_GROUPS
from tag_core.search.mcts import Budget

from .checkpoint import Checkpoint, finite, save_checkpoint
from .features import FEATURE_VERSION, GraphSample
from .model import ModelConfig, PolicyNet, collate
from .prior import GnnPrior
from .problems import SETTINGS, ModelSource, build_problem


@dataclass
class TrainConfig:
    models: list[str]
    topologies: int = 64  # training topology seeds [0, topologies)
    minutes: float | None = 10.0
    generations: int | None = None
    episodes: int = 6  # searches per generation
    iterations: int = 100  # MCTS iterations per search
    min_visits: int = 10  # visits a node needs to become an example (fewer: targets mostly echo the prior)
    epochs: int = 3
    batch_size: int = 16
    lr: float = 1e-3
    weight_decay: float = 1e-4
    seed: int = 0
    groups: int = DEFAULT_GROUPS
    noise: float = 0.25  # share of Dirichlet noise in the root prior
    alpha: float = 0.3
    # Share of uniform probability mixed into every prior while training. Without it PUCT
    # hardly visits what the network dislikes, the visit counts echo the network, and
    # training collapses onto its own first guesses; with it visits follow the rewards.
    explore: float = 0.3
    model: dict = field(default_factory=lambda: ModelConfig().to_dict())

    def __post_init__(self) -> None:
        if not self.models:
            raise TagInputError("--models", "at least one model is needed")
        if self.topologies <= 0:
            raise TagInputError("--topologies", "must be positive")
        if self.minutes is None and self.generations is None:
            raise TagInputError("--minutes", "give a time budget or a number of generations")


@dataclass
class Example:
    sample: GraphSample
    target: np.ndarray


@dataclass
class EpisodeResult:
    model: str
    topology_seed: int
    settings: str
    speedup: float  # DP-NCCL time / best plan found
    first_better: int | None
    examples: list[Example]


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


class _Recorder:
    """The prior hook during training: featurize, remember the sample per tree path, add root noise."""

    def __init__(self, prior: GnnPrior, rng: np.random.Generator, cfg: TrainConfig):
        self.prior, self.rng, self.noise, self.alpha, self.explore = prior, rng, cfg.noise, cfg.alpha, cfg.explore
        self.samples: dict[tuple[int, ...], GraphSample] = {}

    def __call__(self, state) -> np.ndarray:
        sample = self.prior.sample(state)
        self.samples[state.decided] = sample
        p = self.prior.probabilities([sample])[0]
        p = (1 - self.explore) * p + self.explore / len(p)
        if state.depth == 0 and self.noise > 0:
            p = (1 - self.noise) * p + self.noise * self.rng.dirichlet(np.full(len(p), self.alpha))
        return p


def run_episode(net: PolicyNet, sources: dict[str, ModelSource], cfg: TrainConfig, generation: int,
                episode: int) -> EpisodeResult | None:
    rng = np.random.default_rng(_seed(cfg.seed, generation, episode))
    names = sorted(sources)
    for _ in range(8):  # a model may fit no device set of a small cluster: draw again
        name = names[int(rng.integers(len(names)))]
        topo_seed = int(rng.integers(cfg.topologies))
        settings = SETTINGS[int(rng.integers(len(SETTINGS)))]
        try:
            problem = build_problem(sources[name], random_topology(topo_seed), settings)
            break
        except TagInputError:
            continue
    else:
        return None
    recorder = _Recorder(GnnPrior(net), rng, cfg)
    search = problem.search(seed=_seed(cfg.seed, generation, episode, 1), prior=recorder)
    result = search.run(Budget(iterations=cfg.iterations))
    examples = []
    for path, sample in recorder.samples.items():
        visits = search.visit_counts(path)
        if visits.sum() >= cfg.min_visits:
            examples.append(Example(sample, (visits / visits.sum()).astype(np.float32)))
    speedup = problem.dp_time_s / result.time_s if not result.oom and not problem.dp_oom else float("nan")
    return EpisodeResult(name, topo_seed, problem.settings, speedup, result.first_better_than_dp_iteration, examples)


def _loss(net: PolicyNet, examples: list[Example]) -> torch.Tensor:
    batch = collate([e.sample for e in examples])
    target = torch.from_numpy(np.concatenate([e.target for e in examples]))
    return -(target * net(batch)).sum() / len(examples)


def top1_agreement(net: PolicyNet, examples: list[Example]) -> float:
    """Share of examples whose most-visited action is the network's most probable one."""
    if not examples:
        return float("nan")
    with torch.no_grad():
        logp = net(collate([e.sample for e in examples])).numpy()
    hits, start = 0, 0
    for e in examples:
        k = len(e.target)
        hits += int(np.argmax(logp[start:start + k]) == np.argmax(e.target))
        start += k
    return hits / len(examples)


@dataclass
class TrainState:
    net: PolicyNet
    optimizer: torch.optim.Optimizer
    generation: int = 0
    curve: list[dict] = field(default_factory=list)
    wall_s: float = 0.0


def new_state(cfg: TrainConfig, resume: Checkpoint | None = None) -> TrainState:
    torch.manual_seed(cfg.seed)
    net = resume.net if resume is not None else PolicyNet(ModelConfig(**cfg.model))
    net.train()
    optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    state = TrainState(net, optimizer)
    if resume is not None:
        if resume.optimizer:
            optimizer.load_state_dict(resume.optimizer)
        state.generation = int(resume.training.get("generations", 0))
        state.curve = list(resume.metrics.get("curve", []))
        state.wall_s = float(resume.training.get("wall_s", 0.0))
    return state


def train_generation(state: TrainState, sources: dict[str, ModelSource], cfg: TrainConfig) -> dict:
    clock = time.perf_counter()
    gen = state.generation
    state.net.eval()
    episodes = [r for e in range(cfg.episodes) if (r := run_episode(state.net, sources, cfg, gen, e)) is not None]
    examples = [x for r in episodes for x in r.examples]
    agreement = top1_agreement(state.net, examples)
    state.net.train()
    order_gen = torch.Generator().manual_seed(_seed(cfg.seed, gen, 2**20))
    losses: list[float] = []
    for _ in range(cfg.epochs):
        order = torch.randperm(len(examples), generator=order_gen).tolist()
        for start in range(0, len(order), cfg.batch_size):
            chunk = [examples[i] for i in order[start:start + cfg.batch_size]]
            loss = _loss(state.net, chunk)
            state.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(state.net.parameters(), 1.0)
            state.optimizer.step()
            losses.append(loss.item())
    state.generation += 1
    speedups = [r.speedup for r in episodes if math.isfinite(r.speedup)]
    firsts = [r.first_better if r.first_better is not None else cfg.iterations + 1 for r in episodes]
    point = {
        "generation": state.generation, "episodes": len(episodes), "examples": len(examples),
        "loss": finite(statistics.fmean(losses[-max(1, len(losses) // cfg.epochs):])) if losses else None,
        "top1_before_training": finite(agreement),
        "speedup_vs_dp": finite(statistics.fmean(speedups)) if speedups else None,
        "iterations_to_beat_dp": float(statistics.median(firsts)) if firsts else None,
        "wall_s": time.perf_counter() - clock,
        "models": sorted({r.model for r in episodes}),
    }
    state.curve.append(point)
    state.wall_s += point["wall_s"]
    return point


def training_record(cfg: TrainConfig, state: TrainState, sessions: list[dict]) -> tuple[dict, dict]:
    curve = state.curve

    def mean(key: str) -> float | None:  # over the last five generations: one generation is a few problems
        values = [p[key] for p in curve[-5:] if p.get(key) is not None]
        return finite(statistics.fmean(values)) if values else None

    training = {"config": asdict(cfg), "models": sorted(cfg.models), "topology_seeds": [0, cfg.topologies],
                "seed": cfg.seed, "generations": state.generation, "wall_s": state.wall_s,
                "examples": sum(p["examples"] for p in curve), "episodes": sum(p["episodes"] for p in curve),
                "feature_version": FEATURE_VERSION, "sessions": sessions}
    metrics = {"loss": mean("loss"), "top1_before_training": mean("top1_before_training"),
               "speedup_vs_dp": mean("speedup_vs_dp"), "iterations_to_beat_dp": mean("iterations_to_beat_dp"),
               "curve": curve}
    return training, metrics


def train(cfg: TrainConfig, sources: dict[str, ModelSource], out: str | Path, resume: Checkpoint | None = None,
          show_progress: bool = True, log: Callable[[str], None] | None = None) -> tuple[str, dict, dict]:
    """Train until `cfg.generations` (total, counting resumed ones) or `cfg.minutes` (this session).

    Writes `out` after every generation; returns (sha256, training record, metrics).
    """
    missing = sorted(set(cfg.models) - set(sources))
    if missing:
        raise TagInputError("--models", f"no captured graph for {', '.join(missing)}")
    sources = {m: sources[m] for m in cfg.models}
    torch.set_num_threads(1)
    state = new_state(cfg, resume)
    sessions = list(resume.training.get("sessions", [])) if resume is not None else []
    sessions.append({"from_generation": state.generation, "models": sorted(cfg.models), "minutes": cfg.minutes,
                     "resumed_from": resume.short_hash if resume is not None else None})
    start = time.perf_counter()
    bar = _bar(cfg, state, show_progress)
    digest, training, metrics = "", {}, {}
    try:
        while cfg.generations is None or state.generation < cfg.generations:
            if cfg.minutes is not None and time.perf_counter() - start >= cfg.minutes * 60:
                break
            point = train_generation(state, sources, cfg)
            training, metrics = training_record(cfg, state, sessions)
            digest = save_checkpoint(out, state.net, training=training, metrics=metrics, optimizer=state.optimizer)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=_fmt(point["loss"]), top1=_fmt(point["top1_before_training"]),
                                speedup=_fmt(metrics["speedup_vs_dp"]), beat_dp_it=_fmt(point["iterations_to_beat_dp"]))
            elif log is not None:
                log(f"generation {point['generation']}: loss {_fmt(point['loss'])}, top1 "
                    f"{_fmt(point['top1_before_training'])}, speedup {_fmt(point['speedup_vs_dp'])}")
    finally:
        if bar is not None:
            bar.close()
    if not digest:
        training, metrics = training_record(cfg, state, sessions)
        digest = save_checkpoint(out, state.net, training=training, metrics=metrics, optimizer=state.optimizer)
    return digest, training, metrics


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _bar(cfg: TrainConfig, state: TrainState, show: bool):
    if not show:
        return None
    from tqdm import tqdm

    total = cfg.generations if cfg.generations is not None else None
    return tqdm(total=total, initial=state.generation if total else 0, desc="train-gnn", unit="gen",
                file=sys.stderr, mininterval=0.5)
