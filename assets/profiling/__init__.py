"""Stage 2, profiling: `op_profiles`, per-op compute times of each model's training step."""

from .assets import op_profiles

__all__ = ["op_profiles"]
