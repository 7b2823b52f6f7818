"""The user's own Keras model holding the values a run trained: validated on, and written out as `model.keras`.

The model is built as the capture built it (`build_keras`: the same layer names, so each variable's Keras path
is the name the emitted graph and the checkpoints use) and compiled with the spec's loss, optimizer and metrics.
"""

from __future__ import annotations

import os
from pathlib import Path
import numpy as np

from tag_core.capture.models.spec import ModelSpec
from tag_core.errors import TagInputError


class TrainedModel:
    def __init__(self, spec: ModelSpec):
        import keras

        from tag_core.capture.trace import build_keras

        self.spec = spec
        self.model, self.optimizer = build_keras(spec)
        loss = spec.loss if isinstance(spec.loss, (str, keras.losses.Loss)) else None
        # A plain Python loss function would make model.keras unloadable without it: validation computes it
        # here instead, and the saved model is compiled without it.
        self.loss_function = None if loss is not None else spec.make_loss()
        self.model.compile(optimizer=self.optimizer, loss=loss, metrics=spec.make_metrics())
        self.by_path = {getattr(v, "path", v.name): v for v in [*self.model.variables, *self.optimizer.variables]}

    def assign(self, names: list[str], values: list[np.ndarray]) -> None:
        """Set every variable named (model and optimizer alike) to its value."""
        for name, value in zip(names, values):
            variable = self.by_path.get(name)
            if variable is None:  # the spec changed under the run: a bug or an edited model file
                raise TagInputError("model", f"the Keras model has no variable {name}; was the model changed?")
            variable.assign(value)

    def loss_on(self, batch: list[np.ndarray], model=None) -> float:
        """The mean loss of one batch (inputs then labels) through `model` (default this one) in training mode,
        as the traced step computes it."""
        import keras

        model = model or self.model
        inputs = batch[:-1]
        outputs = model(inputs[0] if len(inputs) == 1 else list(inputs), training=True)
        return float(keras.ops.mean(self.spec.make_loss()(batch[-1], outputs)))

    def evaluate(self, batches) -> dict[str, float]:
        """The loss and compiled metrics over `batches` (tuples of inputs then labels), as Keras' evaluate
        reports them (means over samples)."""
        import keras

        inputs = len(self.spec.inputs)

        def split(batch):
            x = batch[:inputs]
            return (x[0] if inputs == 1 else tuple(x)), batch[inputs]

        mapped = batches.map(lambda *batch: split(batch))
        if self.loss_function is None:
            return {k: float(v) for k, v in self.model.evaluate(mapped, verbose=0, return_dict=True).items()}
        # The loss is a plain function: its sample-weighted mean here, the metrics from Keras.
        total, count = 0.0, 0
        metrics = [keras.metrics.get(m) if isinstance(m, str) and m != "accuracy" else m
                   for m in self.spec.make_metrics()]
        trackers = [keras.metrics.SparseCategoricalAccuracy(name="accuracy") if m == "accuracy" else m
                    for m in metrics]
        for x, y in mapped:
            outputs = self.model(x, training=False)
            n = int(y.shape[0])
            total += float(keras.ops.mean(self.loss_function(y, outputs))) * n
            count += n
            for tracker in trackers:
                tracker.update_state(y, outputs)
        return {"loss": total / max(count, 1), **{t.name: float(t.result()) for t in trackers}}

    def save(self, path: Path) -> Path:
        """Write `path` (.keras) through a temporary file and a rename."""
        path = Path(path)
        work = path.with_name(f".{path.stem}.tmp-{os.getpid()}.keras")
        try:
            self.model.save(work)
            os.replace(work, path)
        except BaseException:
            work.unlink(missing_ok=True)
            raise
        return path
