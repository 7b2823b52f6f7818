"""The model registry: a small YAML file listing the models TAG keeps plans for.

    models:
      - vgg19
      - mobilenet_v2[image_size=96]
      - path/to/my_model.py:build

Entries are model references as `tag` takes them. A model's version is the
hash of its builder's file (user models) or of its reference and TAG's
version (zoo models): a change re-plans everything downstream.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from tag_core.errors import TagInputError


def registry_path() -> Path:
    return Path(os.environ.get("TAG_MODELS_FILE", "models.yaml"))


@dataclass(frozen=True)
class RegisteredModel:
    reference: str
    version: str


def reference_version(reference: str) -> str:
    """Cheap version of a model reference: no model is built. Relative paths are from the working directory."""
    from tag_core import __version__

    digest = hashlib.sha256(reference.encode())
    if ".py:" in reference:
        path = Path(reference.rpartition(":")[0])
        try:
            digest.update(path.read_bytes())
        except OSError as exc:
            raise TagInputError("model", f"cannot read {path}: {exc.strerror or exc}")
    else:
        digest.update(__version__.encode())
    return digest.hexdigest()[:16]


def load_registry(path: str | Path) -> list[RegisteredModel]:
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise TagInputError(str(path), f"cannot read the model registry ({exc.strerror or exc})")
    except yaml.YAMLError as exc:
        raise TagInputError(str(path), f"not valid YAML ({str(exc).splitlines()[0]})")
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise TagInputError(f"{path}.models", "must be a list of model references")
    models, seen = [], set()
    for i, entry in enumerate(data["models"]):
        if not isinstance(entry, str) or not entry.strip():
            raise TagInputError(f"{path}.models[{i}]", "must be a non-empty model reference")
        reference = entry.strip()
        if reference in seen:
            raise TagInputError(f"{path}.models[{i}]", f"{reference!r} is listed twice")
        seen.add(reference)
        models.append(RegisteredModel(reference, reference_version(reference)))
    return models
