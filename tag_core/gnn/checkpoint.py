"""GNN checkpoints: a torch file of plain data (state dicts, numbers, strings), read with `weights_only=True`.

`torch.load(weights_only=True)` unpickles tensors and builtin containers only, so a
checkpoint from elsewhere cannot run code. A checkpoint holds:

    format, format_version     what this file is
    features                   the featurizer schema it was trained on (features.schema())
    model_config               ModelConfig fields
    state_dict                 the network's weights
    optimizer                  Adam's state (so `tag train-gnn --resume` continues exactly), or None
    training                   what it was trained on: models, topology seeds, seed, budget, generations
    metrics                    final figures and the per-generation training curve
    tag_version                TAG's version when written

Every way a file can be unusable (missing, not a checkpoint, truncated, another
feature version, weights of the wrong shape, non-finite weights) is a TagInputError
naming the file and what is wrong; callers decide whether to fall back to uniform priors.
"""

from __future__ import annotations

import hashlib
import io
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tag_core import __version__
from tag_core.errors import TagInputError
from tag_core.files import write_atomically

from .features import FEATURE_VERSION, schema
from .model import ModelConfig, PolicyNet

FORMAT = "tag-gnn-checkpoint"
FORMAT_VERSION = 1
# Trained weights stay far below this (the shipped network's largest is under 10); a larger one
# overflows float32 activations and would turn the prior into NaNs mid-search.
MAX_WEIGHT = 1e4
_REQUIRED = ("format", "format_version", "features", "model_config", "state_dict", "training", "metrics")


@dataclass
class Checkpoint:
    net: PolicyNet
    training: dict[str, Any]
    metrics: dict[str, Any]
    optimizer: dict[str, Any] | None = None
    path: Path | None = None
    sha256: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def short_hash(self) -> str | None:
        """What plan lineage records (the `checkpoint_hash` column)."""
        return self.sha256[:16] if self.sha256 else None


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_checkpoint(path: str | Path, net: PolicyNet, *, training: dict, metrics: dict,
                    optimizer: torch.optim.Optimizer | None = None) -> str:
    """Write atomically; returns the file's sha256."""
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "features": schema(),
        "model_config": net.config.to_dict(),
        "state_dict": {k: v.detach().clone() for k, v in net.state_dict().items()},
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "training": training,
        "metrics": metrics,
        "tag_version": __version__,
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    write_atomically(path, data, make_parents=True)
    return hashlib.sha256(data).hexdigest()


def load_checkpoint(path: str | Path, where: str = "checkpoint") -> Checkpoint:
    """Load and validate a checkpoint; TagInputError (naming `where` and the file) when unusable."""
    path = Path(path)
    if path.is_dir():
        raise TagInputError(where, f"{path} is a directory, not a checkpoint file")
    if not path.is_file():
        raise TagInputError(where, f"{path} does not exist (train one with `tag train-gnn --out {path}`)")
    try:
        with warnings.catch_warnings():  # torch warns about foreign pickles on stderr: the error says it all
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated zip, foreign pickle, random bytes: all "not loadable"
        # torch's own first line is long (advice to load unsafely); its type says enough.
        raise TagInputError(where, f"{path} is not a readable TAG GNN checkpoint: corrupt, truncated or not a "
                                   f"torch weights file ({type(exc).__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise TagInputError(where, f"{path} is not a TAG GNN checkpoint (no '{FORMAT}' header)")
    missing = [k for k in _REQUIRED if k not in payload]
    if missing:
        raise TagInputError(where, f"{path} lacks {', '.join(missing)}: corrupt or written by another tool")
    if payload["format_version"] != FORMAT_VERSION:
        raise TagInputError(where, f"{path} has checkpoint format {payload['format_version']}, this TAG reads "
                                   f"format {FORMAT_VERSION}")
    features = payload["features"]
    version = features.get("version") if isinstance(features, dict) else None
    if version != FEATURE_VERSION:
        raise TagInputError(where, f"{path} was trained on feature version {version}; this TAG computes feature "
                                   f"version {FEATURE_VERSION}: retrain with `tag train-gnn`")
    if features != schema():
        changed = sorted(k for k in schema() if features.get(k) != schema()[k])
        raise TagInputError(where, f"{path} was trained on different features ({', '.join(changed)} differ) "
                                   "under the same version number: retrain with `tag train-gnn`")
    try:
        config = ModelConfig(**payload["model_config"])
        net = PolicyNet(config)
        net.load_state_dict(payload["state_dict"], strict=True)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TagInputError(where, f"{path} does not fit the network: {str(exc).splitlines()[0][:200]}") from None
    weights = [v for v in net.state_dict().values() if v.is_floating_point()]
    if not all(bool(torch.isfinite(v).all()) for v in weights):
        raise TagInputError(where, f"{path} holds non-finite weights (a diverged training run?)")
    largest = max((float(v.abs().max()) for v in weights if v.numel()), default=0.0)
    if largest > MAX_WEIGHT:  # finite, but the activations would overflow float32
        raise TagInputError(where, f"{path} holds a weight of magnitude {largest:.3g}, over {MAX_WEIGHT:g} "
                                   "(a diverged training run?)")
    net.eval()
    metrics = payload["metrics"] if isinstance(payload["metrics"], dict) else {}
    return Checkpoint(net=net, training=payload["training"], metrics=metrics, optimizer=payload.get("optimizer"),
                      path=path, sha256=file_sha256(path), extra={"tag_version": payload.get("tag_version")})


def finite(value: float) -> float | None:
    """A metric as JSON-safe float (None for inf/nan)."""
    return float(value) if value is not None and math.isfinite(value) else None
