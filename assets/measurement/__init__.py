"""Stage 6, measurement: `measured_step`, each model × topology's latest plan run here and timed against its
prediction, and its check `measured_step_near_prediction` (checks.py)."""

from .assets import MeasureConfig, measured_folder, measured_step
from .checks import CHECK, STEP_CHECK, THRESHOLD

__all__ = ["CHECK", "STEP_CHECK", "THRESHOLD", "MeasureConfig", "measured_folder", "measured_step"]
