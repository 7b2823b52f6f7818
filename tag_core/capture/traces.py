"""A model's training step traced at several batch sizes, kept for the model a process traced last.

Tracing costs seconds per batch size: Keras traces the model and its optimizer update each time. A process
that emits several strategies of one model (benchmarks, tests, a notebook) then traces each batch size once.
The kept traces come from one build of the model; a build of any other model since (which clears Keras'
session) retires them. Callers get copies, so a rewrite of one trace's GraphDef never reaches another.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .graph import copy_graph_def
from .models import model_source_hash
from .models.spec import ModelSpec
from .trace import TracedStep, build_keras, builds, trace_step


@dataclass
class ModelTraces:
    spec: ModelSpec
    keras_objects: tuple  # (model, optimizer), built with `seed`
    seed: int
    build: int  # `trace.builds()` right after the build: no other model was built while it still matches
    steps: dict[int, TracedStep] = field(default_factory=dict)

    def at(self, batch: int) -> TracedStep:
        """The step at `batch` (traced now if it has not been), as a copy."""
        if batch not in self.steps:
            self.steps[batch] = trace_step(self.spec, batch, self.keras_objects)
        step = self.steps[batch]
        return dataclasses.replace(step, graph_def=copy_graph_def(step.graph_def),
                                   variables=[dataclasses.replace(v) for v in step.variables],
                                   output_shapes=dict(step.output_shapes), flops=dict(step.flops))


_last: ModelTraces | None = None


def model_traces(spec: ModelSpec, seed: int) -> ModelTraces:
    """The traces of `spec` built with Keras' random seed `seed`: the kept ones when they are of this model
    version and seed and still current, else a fresh build."""
    import keras

    global _last
    kept = _last
    if (kept is not None and kept.build == builds() and kept.seed == seed and kept.spec.name == spec.name
            and model_source_hash(kept.spec) == model_source_hash(spec)):
        return kept
    _last = None  # let the old build go before the new one takes memory
    keras.utils.set_random_seed(seed)
    objects = build_keras(spec)
    _last = ModelTraces(spec, objects, seed, builds())
    return _last
