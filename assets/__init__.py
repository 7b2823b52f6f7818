"""Dagster assets, one folder per stage, each a thin adapter over tag_core.

    assets/<stage>/__init__.py   exports the stage's assets and checks
    assets/<stage>/assets.py     the assets
    assets/<stage>/checks.py     the checks of those assets, where the stage has any

A check judges what its asset's materialization just made (a plan, an emitted graph), so the
asset carries its specs (`check_specs=`) and reports the results with the materialization;
checks.py holds the specs and the code that computes the results. A standalone `@asset_check`
would sit in checks.py too, exported by the stage, and reach ALL_ASSET_CHECKS (none today).

Add a stage by adding its folder to STAGES; definitions.py picks it up.
"""

from __future__ import annotations

from dagster import load_asset_checks_from_modules, load_assets_from_modules

from . import capture, cluster, emission, fusion, gnn, measurement, planning, profiling, sfb, training

STAGES = [capture, profiling, cluster, planning, sfb, fusion, emission, measurement, training, gnn]

ALL_ASSETS = load_assets_from_modules(STAGES)
ALL_ASSET_CHECKS = load_asset_checks_from_modules(STAGES)
