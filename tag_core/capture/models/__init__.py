"""The model zoo and user models.

A model reference is either a zoo name, optionally with options
(`mobilenet_v2[image_size=96]`), or `path/to/file.py:function`. The function
returns a `ModelSpec` or a plain `keras.Model`. Importing the file and calling the
function each run under the model timeout (time_limit.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any, Callable

from tag_core.errors import TagInputError

from ..time_limit import ModelTimeout, can_interrupt, model_timeout, time_limit
from .spec import InputSpec, ModelSpec
from .text import bert_base, transformer
from .vision import inception_v3, mlp, mobilenet_v2, resnet101, small_cnn, vgg19

__all__ = ["InputSpec", "ModelSpec", "ZOO", "BENCHMARK_MODELS", "resolve_model", "model_source_hash"]

ZOO: dict[str, Callable[..., ModelSpec]] = {
    "vgg19": vgg19,
    "resnet101": resnet101,
    "inception_v3": inception_v3,
    "mobilenet_v2": mobilenet_v2,
    "transformer": transformer,
    "bert_base": bert_base,
    "mlp": mlp,
    "small_cnn": small_cnn,
}
BENCHMARK_MODELS = ["vgg19", "resnet101", "inception_v3", "mobilenet_v2", "transformer", "bert_base"]

_WITH_OPTIONS = re.compile(r"^(?P<name>[A-Za-z0-9_]+)\[(?P<options>[^\]]*)\]$")


def zoo_defaults(name: str) -> dict[str, Any]:
    """A zoo builder's options and their defaults."""
    return {
        p.name: p.default
        for p in inspect.signature(ZOO[name]).parameters.values()
        if p.default is not inspect.Parameter.empty
    }


def split_models(text: str) -> list[str]:
    """Comma-separated model references; commas inside a reference's [options] do not split."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [part.strip() for part in [*parts, current] if part.strip()]


def resolve_model(reference: str, batch_size: int | None = None, timeout: float | None = None) -> ModelSpec:
    """Turn a model reference into a ModelSpec. Raises TagInputError for bad references, and for a user's
    file whose import or function takes longer than `timeout` seconds (default: see time_limit.model_timeout);
    the spec keeps the timeout for building and tracing later."""
    if not isinstance(reference, str) or not reference.strip():
        raise TagInputError("model", "a model name or path/to/file.py:function is required")
    reference = reference.strip()
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size <= 0):
        raise TagInputError("batch_size", f"must be a positive integer, got {batch_size!r}")
    timeout = model_timeout(timeout)
    if ".py:" in reference:
        spec = _load_user_model(reference, timeout)
    else:
        spec = _zoo_model(reference)
    spec.timeout = timeout
    spec.reference = reference
    if batch_size is not None:
        spec.batch_size = batch_size
    if spec.batch_size <= 0:
        raise TagInputError("batch_size", f"must be a positive integer, got {spec.batch_size!r}")
    return spec


def _zoo_model(reference: str) -> ModelSpec:
    match = _WITH_OPTIONS.match(reference)
    name, raw_options = (match["name"], match["options"]) if match else (reference, "")
    if name not in ZOO:
        known = ", ".join(sorted(ZOO))
        raise TagInputError("model", f"unknown model {reference!r}; known models: {known} (or path/to/file.py:function)")
    defaults = zoo_defaults(name)
    options: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in raw_options.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in defaults:
            raise TagInputError("model", f"{name} has no option {key!r}; options: {', '.join(defaults)}")
        if key in options:
            raise TagInputError("model", f"option {key} of {name} is given twice")
        try:
            options[key] = type(defaults[key])(value.strip())
        except ValueError:
            raise TagInputError("model", f"option {key} of {name} must be {type(defaults[key]).__name__}, got {value!r}")
        if isinstance(options[key], int) and options[key] <= 0:
            raise TagInputError("model", f"option {key} of {name} must be positive, got {value!r}")
    spec = ZOO[name](**options)
    spec.name = reference
    return spec


def _load_user_model(reference: str, timeout: float) -> ModelSpec:
    path_text, _, function_name = reference.rpartition(":")
    if Path(path_text).is_file() and function_name.isidentifier() and not can_interrupt():
        # nothing here could stop a hang: find it in a process that can be killed
        from ..load_check import load_in_child

        load_in_child(reference, timeout)
    import keras  # noqa: F401  TensorFlow's start-up (seconds) is TAG's, not the model's: before the clock starts

    built, builder = call_file_function(reference, timeout, "model", what="builder")
    spec = _as_spec(built, reference, builder)
    spec.source_file = str(Path(path_text).resolve())
    return spec


def call_file_function(reference: str, timeout: float, where: str, what: str = "function") -> tuple[Any, Callable]:
    """(what `path/to/file.py:function` returns, the function): the file imported and the function called, each
    under `timeout` seconds (time_limit.py); anything that goes wrong is a TagInputError naming `where`."""
    path_text, _, function_name = reference.rpartition(":")
    path = Path(path_text)
    if not path.is_file():
        raise TagInputError(where, f"file {path_text!r} does not exist")
    if not function_name.isidentifier():
        raise TagInputError(where, f"{function_name!r} is not a function name (use path/to/file.py:function)")
    module_name = "tag_user_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    try:
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        with time_limit(timeout, f"importing {path_text} (for its function {function_name})"):
            loader_spec.loader.exec_module(module)
    except ModelTimeout as exc:
        raise exc if where == "model" else TagInputError(where, exc.problem) from None
    except (Exception, SystemExit) as exc:  # the user's file: any failure (even sys.exit) is their input's
        raise TagInputError(where, f"could not import {path_text}: {type(exc).__name__}: {exc}")
    function = getattr(module, function_name, None)
    if not callable(function):
        raise TagInputError(where, f"{path_text} has no function {function_name!r}")
    try:
        with time_limit(timeout, f"{function_name}() of {path_text}"):
            return function(), function
    except ModelTimeout as exc:
        raise exc if where == "model" else TagInputError(where, exc.problem) from None
    except (Exception, SystemExit) as exc:
        raise TagInputError(where, f"{what} {reference} raised {type(exc).__name__}: {exc}")


def _as_spec(built: Any, reference: str, builder: Callable) -> ModelSpec:
    if isinstance(built, ModelSpec):
        built.name = reference
        return built
    import keras

    if not isinstance(built, keras.Model):
        raise TagInputError(
            "model", f"builder {reference} returned {type(built).__name__}; expected a ModelSpec or a keras.Model"
        )
    # A Sequential without an Input (or a subclassed model never called) has no graph to trace yet:
    # keras raises AttributeError from `.inputs`/`.outputs`.
    try:
        defined = bool(built.inputs) and bool(built.outputs)
    except AttributeError:
        defined = False
    if not defined:
        raise TagInputError("model", f"{reference}: model has no defined inputs; give it a keras.Input "
                                     "(e.g. keras.Input((12,)) as the first layer of a Sequential)")
    if len(built.outputs) != 1:
        raise TagInputError("model", f"{reference} has {len(built.outputs)} outputs; a plain keras.Model needs one "
                                     "(return a ModelSpec with a loss over all of them)")
    inputs = []
    for i, tensor in enumerate(built.inputs):
        shape = tuple(tensor.shape[1:])
        if any(d is None for d in shape):
            raise TagInputError("model", f"input {i} of {reference} has an unknown dimension {tuple(tensor.shape)}; give a fixed shape")
        dtype = str(tensor.dtype)
        inputs.append(InputSpec(f"input_{i}", shape, dtype, max_value=100 if "int" in dtype else None))
    classes = built.outputs[0].shape[-1]
    if classes is None:
        raise TagInputError("model", f"the output of {reference} has no fixed last dimension for class labels")
    label_shape = tuple(built.outputs[0].shape[1:-1])
    def build():  # build anew each time: names then come out the same in every build
        return builder()

    return ModelSpec(
        name=reference,
        build=build,
        inputs=inputs,
        label=InputSpec("labels", label_shape, "int32", max_value=int(classes)),
    )


def model_source_hash(spec: ModelSpec) -> str:
    """Hash of what defines the model: the builder's file for user models, the options for zoo ones."""
    digest = hashlib.sha256()
    digest.update(spec.name.encode())
    if spec.source_file:
        digest.update(Path(spec.source_file).read_bytes())
    else:
        from tag_core import __version__

        digest.update(repr(sorted(spec.options.items())).encode() + __version__.encode())
    return digest.hexdigest()[:16]
