"""Declarative automation: every stage below the roots re-materializes when what it reads changes.

Roots (`training_graph`, `cluster_topology`) are driven by the sensors; the
stages below them carry `AutomationCondition.eager()`, so a new topology or
model flows through to plans, SFB decisions and graphs. `training_run` is
materialized only when asked (MANUAL).
"""

from dagster import (
    AssetSelection,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
    map_asset_specs,
)

ROOTS = {"training_graph", "cluster_topology"}
# Materialized when asked, never by the automation: training costs hours on real clusters.
MANUAL = {"training_run"}


def with_automation(assets: list) -> list:
    """The assets, with eager automation on every non-root stage that has no condition of its own."""

    def eager(spec):
        key = spec.key.to_user_string()
        if key in ROOTS or key in MANUAL or spec.automation_condition is not None:
            return spec
        return spec.replace_attributes(automation_condition=AutomationCondition.eager())

    return list(map_asset_specs(eager, assets))


automation_sensor = AutomationConditionSensorDefinition(
    "tag_automation",
    target=AssetSelection.all(),
    minimum_interval_seconds=15,
    default_status=DefaultSensorStatus.RUNNING,
)
