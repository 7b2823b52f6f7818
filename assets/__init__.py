"""Dagster assets, one folder per stage: `assets/<stage>/assets.py` holds the stage's assets and,
where it has any, `assets/<stage>/checks.py` the asset checks of those assets. Each asset is a thin
adapter over tag_core.

Add a stage by adding its folder (its `__init__` exports its assets) to STAGES; definitions.py picks it up.
"""

from __future__ import annotations

from dagster import load_asset_checks_from_modules, load_assets_from_modules

from . import capture, cluster, emission, fusion, gnn, planning, profiling, sfb

STAGES = [capture, profiling, cluster, planning, sfb, fusion, emission, gnn]

ALL_ASSETS = load_assets_from_modules(STAGES)
ALL_ASSET_CHECKS = load_asset_checks_from_modules(STAGES)
