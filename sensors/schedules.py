"""The nightly re-plan: `deployment_plan` for every live model × topology, warm-started.

Live topologies are the snapshots still in TAG_TOPOLOGY_DIR (a deleted one is
retired and keeps its history). The cron comes from TAG_REPLAN_CRON.
"""

import os

from dagster import (
    DefaultScheduleStatus,
    MultiPartitionKey,
    RunRequest,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from assets.planning import deployment_plan
from tag_core.cluster import scan_snapshots, topology_directory
from tag_pipelines.partitions import model_partitions, topology_partitions

DEFAULT_CRON = "0 2 * * *"


@schedule(
    name="nightly_replan",
    cron_schedule=os.environ.get("TAG_REPLAN_CRON", DEFAULT_CRON),
    target=[deployment_plan],
    default_status=DefaultScheduleStatus.RUNNING,
)
def nightly_replan(context: ScheduleEvaluationContext):
    models = context.instance.get_dynamic_partitions(model_partitions.name)
    present = {scan.name for scan in scan_snapshots(topology_directory(), settle_s=0) if scan.status == "ready"}
    topologies = [t for t in context.instance.get_dynamic_partitions(topology_partitions.name) if t in present]
    if not models or not topologies:
        return SkipReason("no live model × topology to re-plan")
    stamp = context.scheduled_execution_time.strftime("%Y%m%dT%H%M")
    return [
        RunRequest(
            run_key=f"replan:{model}:{topology}:{stamp}",
            partition_key=MultiPartitionKey({"model": model, "topology": topology}),
            run_config={"ops": {"deployment_plan": {"config": {"warm_start": True}}}},
            tags={"tag/replan": "nightly"},
        )
        for model in models
        for topology in topologies
    ]
