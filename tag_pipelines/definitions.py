"""The TAG code location: `load_from: python_module: tag_pipelines.definitions`.

A merge of what the stage folders under `assets/` define (assets and their checks), the sensors
and schedules in `sensors/`, and the resources of the environment TAG_ENV names (default `local`;
see tag_pipelines.resources), and in cluster mode the Celery executor.
"""

from __future__ import annotations

from dagster import Definitions

from assets import ALL_ASSET_CHECKS, ALL_ASSETS
from sensors import SCHEDULES, SENSORS, with_automation

from .resources import build_resources, executor_for

defs = Definitions(
    assets=with_automation(ALL_ASSETS),
    asset_checks=ALL_ASSET_CHECKS,
    sensors=SENSORS,
    schedules=SCHEDULES,
    resources=build_resources(),
    executor=executor_for(),
)
