"""ModelSpec: everything TAG needs to trace one training step of a Keras model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class InputSpec:
    """One model input (or the label), per sample: no batch dimension."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    # Integer inputs (token ids, class labels) are drawn from [0, max_value).
    max_value: int | None = None


@dataclass
class ModelSpec:
    name: str
    build: Callable[[], Any]  # returns a keras.Model
    inputs: list[InputSpec]
    label: InputSpec
    # A Keras loss name, or any callable (labels, outputs) -> scalar loss.
    loss: str | Callable = "sparse_categorical_crossentropy"
    optimizer: Callable[[], Any] | None = None  # returns a keras optimizer; Adam when None
    # Keras metrics `tag train` reports on validation data; None: accuracy for the classification losses.
    metrics: list[Any] | None = None
    batch_size: int = 32
    # File the builder lives in, for user models: its hash tells when the model changed.
    source_file: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    # Seconds building and tracing may take (time_limit.py); resolve_model sets it, None: the default.
    timeout: float | None = field(default=None, compare=False)
    # The reference resolve_model made it from: a child process can make the same spec again from it.
    reference: str | None = field(default=None, compare=False)

    def make_optimizer(self):
        import keras

        return self.optimizer() if self.optimizer is not None else keras.optimizers.Adam()

    def make_metrics(self) -> list[Any]:
        if self.metrics is not None:
            return list(self.metrics)
        classifying = self.loss in ("sparse_categorical_crossentropy", "categorical_crossentropy",
                                    "binary_crossentropy")
        return ["accuracy"] if classifying else []

    def make_loss(self):
        import keras

        if callable(self.loss):
            return self.loss
        return keras.losses.get(self.loss)
