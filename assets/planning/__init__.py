"""Stage 3, planning: `op_groups` per model and `deployment_plan` per model × topology,
with the plan's checks `plan_fits_memory` and `plan_beats_baselines` (checks.py)."""

from .assets import GroupsConfig, PlanConfig, deployment_plan, op_groups
from .checks import PLAN_CHECKS

__all__ = ["PLAN_CHECKS", "GroupsConfig", "PlanConfig", "deployment_plan", "op_groups"]
