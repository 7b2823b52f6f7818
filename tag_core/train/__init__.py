"""Training a model with its plan: real data in, checkpoints and resume, the user's Keras model out.

In: a `ModelSpec`, a plan (or a strategy and topology), training data (`.npz` or a function returning a
`tf.data.Dataset`), a run folder. Out: a `TrainResult`; in the run folder the emitted step, checkpoints keyed by
the model's variable paths (so a run goes on under another plan of the same model), TensorBoard logs and
`model.keras`. The training loop runs in a child process on TF's distributed runtime (tag_core.runtime).
"""

# First, before numpy starts threads: the trainer, a child of a local run, joins the run's network namespace when
# tag_core.runtime is imported (see tag_core.runtime.supervisor), and a process must have one thread to join it.
import tag_core.runtime  # noqa: F401, I001

from .checkpoints import complete_checkpoints, latest_checkpoint
from .data import TrainingData, load_data
from .run import TrainResult, train

__all__ = ["TrainResult", "TrainingData", "complete_checkpoints", "latest_checkpoint", "load_data", "train"]
