"""The MCTS prior hook built from a checkpoint, and how `tag plan` / `deployment_plan` pick a prior.

`GnnPrior(net)(state)` featurizes the node's state (static features built once per
evaluator), runs the network and returns one probability per action, mixed with a
uniform floor so that MCTS can still reach an action the network dislikes.

`choose_prior(kind, checkpoint)`:
  - "uniform": no network.
  - "gnn": the given checkpoint, else the default one; any problem is a TagInputError
    (the user asked for the GNN, so a silent fallback would hide a wrong setup).
  - None (the default): the GNN when a default checkpoint exists and loads; uniform when
    there is none; uniform *with a warning* when it exists but is unusable.
The default checkpoint is $TAG_GNN_CHECKPOINT if set (empty: none), else the one
shipped in data/checkpoints/default.pt.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tag_core import artifacts
from tag_core.errors import TagInputError

SHIPPED_CHECKPOINT = Path(__file__).resolve().parents[2] / "data" / "checkpoints" / "default.pt"
# Share of probability spread uniformly over all actions: the same mixture the network was trained
# under (TrainConfig.explore). The argmax (MCTS's first pick) does not change; what does is how soon
# the search leaves a confident but wrong first pick (testbed.json in the DP-NCCL space stalled at 0.05).
UNIFORM_FLOOR = 0.3
PRIOR_KINDS = ("gnn", "uniform")
# The joint graph has an edge per ordered machine pair and two per (op group, machine) pair. A forward
# pass costs ~4 µs per edge on one core (1,024 machines: 4.3 s and 1.5 GB), once per new search node,
# so past this size the priors cost more than the simulations they are meant to save.
MAX_JOINT_EDGES = 65_536


class GnnPrior:
    """A `tag_core.search.mcts.Prior`: SearchState -> probabilities over the state's actions."""

    def __init__(self, net, floor: float = UNIFORM_FLOOR, checkpoint_hash: str | None = None):
        import torch

        torch.set_num_threads(1)  # graphs of ~100 nodes: threads only add overhead (and fight for the cores)
        self.net = net.eval()
        self.floor = float(floor)
        self.checkpoint_hash = checkpoint_hash
        self._features = None
        self.calls, self.seconds = 0, 0.0

    def features(self, evaluator):
        """Static features of `evaluator`'s problem, rebuilt when the evaluator or its action space changes."""
        from .features import ProblemFeatures

        pf = self._features
        if pf is None or pf.evaluator is not evaluator or pf.space_size != evaluator.space.size:
            pf = self._features = ProblemFeatures(evaluator)
        return pf

    def sample(self, state):
        return self.features(state.evaluator).sample(state.actions, state.decided_groups, state.group, state.sim_result())

    def probabilities(self, samples: list) -> list[np.ndarray]:
        """The network's own distribution (no floor) for each sample."""
        import torch

        from .model import collate

        with torch.no_grad():
            logp = self.net(collate(samples)).numpy().astype(np.float64)
        out, start = [], 0
        for s in samples:
            k = len(s.action_x)
            out.append(np.exp(logp[start:start + k]))
            start += k
        return out

    def __call__(self, state) -> np.ndarray:
        clock = time.perf_counter()
        p = self.probabilities([self.sample(state)])[0]
        if not np.all(np.isfinite(p)) or p.sum() <= 0:
            raise TagInputError("GNN checkpoint", f"{self.checkpoint_hash} gave non-finite probabilities for this problem")
        p = (1.0 - self.floor) * p / p.sum() + self.floor / len(p)
        self.calls += 1
        self.seconds += time.perf_counter() - clock
        return p


@dataclass
class PriorChoice:
    kind: str  # "gnn" or "uniform"
    prior: GnnPrior | None
    checkpoint: Path | None = None
    checkpoint_hash: str | None = None
    warning: str | None = None  # set when the default checkpoint was unusable and uniform priors stand in
    training: dict[str, Any] = field(default_factory=dict)

    def lineage(self) -> dict[str, Any]:
        """Plan lineage entries: `checkpoint` fills the plans table's checkpoint_hash column."""
        return {"prior": self.kind, "checkpoint": self.checkpoint_hash,
                "checkpoint_file": str(self.checkpoint) if self.checkpoint else None}


def joint_edges(num_machines: int, num_groups: int) -> int:
    """Edges of the GNN's op+device graph for a problem (the op-to-op edges are few and left out)."""
    return num_machines * (num_machines - 1) + 2 * num_groups * num_machines


def sized_prior(choose: Callable[[], PriorChoice], asked: str | None, num_machines: int,
                num_groups: int) -> PriorChoice:
    """`choose()`, unless the problem's joint graph is too large for the GNN: then uniform priors with a
    warning, without loading the network (torch and dgl take seconds to import), or refused when the user
    asked for the GNN by name (`asked` is "gnn")."""
    edges = joint_edges(num_machines, num_groups)
    if asked == "uniform" or edges <= MAX_JOINT_EDGES:
        return choose()
    why = (f"the GNN's joint graph for {num_machines} machines x {num_groups} op groups has {edges:,} edges, "
           f"more than the {MAX_JOINT_EDGES:,} whose priors cost less than the simulations they guide")
    if asked == "gnn":
        raise TagInputError("--prior", f"{why}; use --prior uniform")
    return PriorChoice("uniform", None, warning=f"{why}; planning with uniform priors")


def default_checkpoint() -> Path | None:
    env = os.environ.get("TAG_GNN_CHECKPOINT")
    if env is not None:
        return Path(env) if env.strip() else None
    return SHIPPED_CHECKPOINT


def load_prior(path: str | Path, where: str = "--checkpoint") -> PriorChoice:
    """The GNN prior of a checkpoint file; TagInputError when the file is unusable."""
    try:
        from .checkpoint import load_checkpoint
    except ImportError as exc:  # dgl or torch not importable
        raise TagInputError(where, f"the GNN prior needs torch and dgl: {exc}") from None
    ckpt = load_checkpoint(path, where=where)
    return PriorChoice("gnn", GnnPrior(ckpt.net, checkpoint_hash=ckpt.short_hash), Path(path), ckpt.short_hash,
                       training=ckpt.training)


def choose_prior(kind: str | None = None, checkpoint: str | Path | None = None) -> PriorChoice:
    """See the module docstring for the rules."""
    if kind is not None and kind not in PRIOR_KINDS:
        raise TagInputError("--prior", f"must be one of {', '.join(PRIOR_KINDS)}, got {kind!r}")
    if kind == "uniform":
        if checkpoint is not None:
            raise TagInputError("--checkpoint", "only applies to --prior gnn")
        return PriorChoice("uniform", None)
    if checkpoint is not None:  # an explicit file must work, whatever `kind`
        return load_prior(checkpoint, "--checkpoint")
    path = default_checkpoint()
    if kind == "gnn":
        if path is None:
            raise TagInputError("--prior", "gnn needs a checkpoint: pass --checkpoint or set TAG_GNN_CHECKPOINT")
        return load_prior(path, "--prior gnn")
    if path is None:
        return PriorChoice("uniform", None)
    if not path.exists():
        # The shipped file missing just means "no GNN yet"; a TAG_GNN_CHECKPOINT that names nothing is a mistake.
        note = None if path == SHIPPED_CHECKPOINT else f"TAG_GNN_CHECKPOINT: {path} does not exist; uniform priors"
        return PriorChoice("uniform", None, warning=note)
    try:
        return load_prior(path, "default GNN checkpoint")
    except TagInputError as exc:
        return PriorChoice("uniform", None, warning=f"{exc}; planning with uniform priors instead")


def trained_checkpoint() -> Path:
    """Where the `gnn_checkpoint` asset writes before publishing: $TAG_HOME/gnn/checkpoint.pt."""
    from tag_core.store.connection import tag_home

    return tag_home() / "gnn" / "checkpoint.pt"


# The ref under TAG_ARTIFACTS that names the `gnn_checkpoint` asset's latest checkpoint, for every worker.
CHECKPOINT_REF = "gnn/checkpoint"


def publish_checkpoint(path: Path) -> str:
    """Put the checkpoint at `path` under TAG_ARTIFACTS and make it the current one; its address."""
    address = artifacts.put_file(path, "checkpoint.pt")
    artifacts.set_ref(CHECKPOINT_REF, address)
    return address


def current_checkpoint() -> Path | None:
    """A local copy of the `gnn_checkpoint` asset's latest checkpoint: the ref's artifact, else the file an
    older TAG left in $TAG_HOME/gnn/, else None."""
    address = artifacts.get_ref(CHECKPOINT_REF)
    if address is not None:
        return artifacts.fetch(address)
    old = trained_checkpoint()
    return old if old.exists() else None


def pipeline_prior(kind: str = "auto") -> PriorChoice:
    """The deployment_plan asset's prior: the `gnn_checkpoint` asset's checkpoint when there is one, else
    `choose_prior`."""
    kind_or_none = None if kind == "auto" else kind
    current = current_checkpoint() if kind_or_none != "uniform" else None
    if current is not None:
        return load_prior(current, "gnn_checkpoint")
    return choose_prior(kind_or_none)
