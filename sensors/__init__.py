"""Dagster sensors and schedules.

They arrive in a later issue (topology and model sensors, automation, the
nightly re-plan). definitions.py already wires these lists in, so a new
sensor or schedule only needs to be appended here.
"""

from __future__ import annotations

SENSORS: list = []
SCHEDULES: list = []
