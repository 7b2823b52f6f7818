"""Stage 3, planning: `op_groups` per model and `deployment_plan` per model × topology."""

from .assets import GroupsConfig, PlanConfig, deployment_plan, op_groups

__all__ = ["GroupsConfig", "PlanConfig", "deployment_plan", "op_groups"]
