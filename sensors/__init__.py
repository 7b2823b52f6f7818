"""Dagster sensors and schedules: re-plan when a topology snapshot or a model changes, and nightly."""

from .automation import automation_sensor, with_automation
from .models import model_sensor
from .schedules import nightly_replan
from .topology_snapshots import topology_snapshot_sensor

SENSORS = [topology_snapshot_sensor, model_sensor, automation_sensor]
SCHEDULES = [nightly_replan]

__all__ = ["SENSORS", "SCHEDULES", "with_automation"]
