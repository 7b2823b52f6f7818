"""Stage 3, planning: `op_groups`, `cluster_topology` and `deployment_plan`."""

from .assets import GroupsConfig, PlanConfig, cluster_topology, deployment_plan, op_groups

__all__ = ["GroupsConfig", "PlanConfig", "cluster_topology", "deployment_plan", "op_groups"]
