"""Dagster assets, one module per stage. Each asset is a thin adapter over tag_core.

Add a stage by adding its module to STAGE_MODULES; definitions.py picks it up.
"""

from __future__ import annotations

from dagster import load_asset_checks_from_modules, load_assets_from_modules

from . import capture, emission, fusion, gnn, planning, profiling, sfb

STAGE_MODULES = [capture, profiling, planning, sfb, fusion, emission, gnn]

ALL_ASSETS = load_assets_from_modules(STAGE_MODULES)
ALL_ASSET_CHECKS = load_asset_checks_from_modules(STAGE_MODULES)
