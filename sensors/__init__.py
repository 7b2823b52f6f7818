"""Dagster sensors and schedules, side by side: re-plan when a topology snapshot or a model changes, and nightly.

    topology_snapshots.py   topology_snapshot_sensor: snapshots dropped into TAG_TOPOLOGY_DIR
    models.py               model_sensor: entries of the model registry (models.yaml)
    calibrations.py         calibration_sensor: calibrations dropped into TAG_CALIBRATION_DIR
    automation.py           tag_automation: eager declarative automation below the roots (with_automation)
    schedules.py            nightly_replan: deployment_plan for every live model × topology
"""

from .automation import automation_sensor, with_automation
from .calibrations import calibration_sensor
from .models import model_sensor
from .schedules import nightly_replan
from .topology_snapshots import topology_snapshot_sensor

SENSORS = [topology_snapshot_sensor, calibration_sensor, model_sensor, automation_sensor]
SCHEDULES = [nightly_replan]

__all__ = [
    "SCHEDULES", "SENSORS", "automation_sensor", "calibration_sensor", "model_sensor", "nightly_replan", "topology_snapshot_sensor",
    "with_automation",
]
