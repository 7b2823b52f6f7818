"""Training checkpoints: every variable of the model and its optimizer, keyed by its Keras path, and where the
run stood.

    RUN_DIR/checkpoints/step-00000120/variables.index, variables.data-00000-of-00001
                                                      a TF checkpoint (`tf.train.load_checkpoint` reads it)
                                      state.json      step, epoch, batches done in it, seed, and what the values
                                                      belong to: model, graph hash, global batch, data hash
    RUN_DIR/checkpoints/checkpoint                    TF's pointer to the newest (`tf.train.latest_checkpoint`)

A checkpoint is written into a hidden temporary folder beside the others and renamed into place once complete,
so a process killed at any moment leaves the last complete one as it was; its half-written folder is swept at
the next write. The newest `KEEP` are kept. Values are keyed by the model's variables, not by the copies a plan
made of them, so a checkpoint saved under one plan restores under any other plan of the same model and batch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from tag_core.errors import TagInputError

FOLDER = "checkpoints"
KEEP = 3
PREFIX = "variables"
STATE = "state.json"
_NAME = re.compile(r"^step-(\d{8,})$")
# What must match for a checkpoint's values to be this run's: field, how the message names it.
IDENTITY = [("model", "model"), ("graph_hash", "captured graph (graph hash)"), ("batch_size", "global batch"),
            ("data_hash", "training data (content hash)")]


def checkpoint_folder(run_dir: str | Path) -> Path:
    return Path(run_dir) / FOLDER


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete checkpoints of a run, oldest first."""
    folder = checkpoint_folder(run_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name)) and (p / STATE).is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def read_state(checkpoint: Path) -> dict[str, Any]:
    try:
        state = json.loads((checkpoint / STATE).read_text())
    except (OSError, ValueError) as exc:
        raise TagInputError("--resume", f"{checkpoint / STATE} cannot be read ({type(exc).__name__})") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int) or not isinstance(
            state.get("variables"), list):
        raise TagInputError("--resume", f"{checkpoint / STATE} is not a TAG training checkpoint's state")
    return state


def read_values(checkpoint: Path, variables: list[dict[str, Any]]) -> list[np.ndarray]:
    """The values of `variables` (name, shape, dtype, as plan.json lists them) from a checkpoint, in that order."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(checkpoint / PREFIX))
    return [np.asarray(reader.get_tensor(v["name"])).astype(v["dtype"], copy=False).reshape(v["shape"])
            for v in variables]


def check_compatible(state: dict[str, Any], identity: dict[str, Any], variables: list[dict[str, Any]],
                     checkpoint: Path) -> None:
    """A checkpoint restores only into the model, graph, batch and data it was saved from, and only with the same
    variables; TagInputError naming the first difference."""
    for key, label in IDENTITY:
        if key in identity and state.get(key) != identity[key]:
            raise TagInputError("--resume", f"{checkpoint} is of another {label}: {state.get(key)!r}, this run "
                                            f"has {identity[key]!r}")
    saved = {v["name"]: v for v in state["variables"]}
    wanted = {v["name"]: v for v in variables}
    missing, extra = sorted(set(wanted) - set(saved)), sorted(set(saved) - set(wanted))
    if missing or extra:
        parts = ([f"lacks {', '.join(missing[:3])}"] if missing else []) + (
            [f"has {', '.join(extra[:3])}, which this model does not"] if extra else [])
        raise TagInputError("--resume", f"{checkpoint} holds other variables: it {'; it '.join(parts)}")
    for name, v in wanted.items():
        s = saved[name]
        if list(s["shape"]) != list(v["shape"]) or s["dtype"] != v["dtype"]:
            raise TagInputError("--resume", f"{checkpoint}: variable {name} is {s['dtype']}{list(s['shape'])} there, "
                                            f"{v['dtype']}{list(v['shape'])} in this model")


def write_checkpoint(run_dir: str | Path, values: list[np.ndarray], variables: list[dict[str, Any]],
                     state: dict[str, Any], keep: int = KEEP) -> Path:
    """Write a checkpoint of `values` (one per entry of `variables`) at `state["step"]`; see the module docstring."""
    import tensorflow as tf

    folder = checkpoint_folder(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step-{state['step']:08d}"
    work = folder / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        with tf.device("/cpu:0"):
            tf.raw_ops.SaveV2(prefix=str(work / PREFIX), tensor_names=[v["name"] for v in variables],
                              shape_and_slices=[""] * len(variables), tensors=[np.asarray(x) for x in values])
        described = [{"name": v["name"], "shape": list(v["shape"]), "dtype": v["dtype"]} for v in variables]
        (work / STATE).write_text(json.dumps({**state, "variables": described}, indent=1))
        for path in work.iterdir():
            _fsync(path)
        _fsync(work)
        if final.exists():  # the same step written again (a run resumed and stopped at once)
            old = folder / f".{final.name}.old-{os.getpid()}"
            final.rename(old)
            work.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            work.rename(final)
        _fsync(folder)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    _prune(folder, keep)
    _point_to(folder, final)
    return final


def _point_to(folder: Path, checkpoint: Path) -> None:
    """TF's `checkpoint` state file, so that `tf.train.latest_checkpoint(folder)` finds the newest."""
    from tag_core.files import write_atomically

    kept = [p.name for p in complete_checkpoints(folder.parent)]
    lines = [f'model_checkpoint_path: "{checkpoint.name}/{PREFIX}"']
    lines += [f'all_model_checkpoint_paths: "{name}/{PREFIX}"' for name in kept]
    write_atomically(folder / "checkpoint", "\n".join(lines) + "\n")


def _prune(folder: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints; sweep what killed writers left (their hidden folders)."""
    for old in complete_checkpoints(folder.parent)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for path in folder.iterdir():
        if path.name.startswith(".step-") and path.is_dir() and not path.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(path, ignore_errors=True)


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
