"""Stage 7, training: `training_run`, the model trained with its latest plan on real data (off in the automation:
training is costly, so it runs when asked)."""

from .assets import TrainConfig, training_folder, training_run

__all__ = ["TrainConfig", "training_folder", "training_run"]
