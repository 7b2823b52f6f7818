"""Fusion: `fusion_plan`, fused patterns of memory-intensive ops per model (FusionStitching)."""

from .assets import FusionConfig, fusion_plan

__all__ = ["FusionConfig", "fusion_plan"]
