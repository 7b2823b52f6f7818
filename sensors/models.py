"""`model_sensor`: keep a `model` partition for every entry of the model registry (models.yaml).

A new entry adds its partition; a new entry or a changed builder file (by
hash) requests a run of the model-level stages (capture, profiles, groups).
Eager automation re-plans everything downstream of them.
"""

import json

from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from assets.capture import training_graph
from assets.planning import op_groups
from assets.profiling import op_profiles
from tag_core.capture import load_registry, registry_path
from tag_core.errors import TagInputError
from tag_pipelines.partitions import model_partitions


@sensor(
    name="model_sensor",
    asset_selection=[training_graph, op_profiles, op_groups],
    minimum_interval_seconds=10,
    default_status=DefaultSensorStatus.RUNNING,
)
def model_sensor(context: SensorEvaluationContext):
    path = registry_path()
    if not path.exists():
        return SkipReason(f"no model registry at {path}")
    try:
        registered = load_registry(path)
    except TagInputError as exc:
        context.log.warning(f"skipping the model registry: {exc}")
        return SkipReason(str(exc))
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    known = set(context.instance.get_dynamic_partitions(model_partitions.name))
    new_partitions = [m.reference for m in registered if m.reference not in known]
    requests = [
        RunRequest(run_key=f"model:{m.reference}:{m.version}", partition_key=m.reference,
                   tags={"tag/model_version": m.version})
        for m in registered
        if seen.get(m.reference) != m.version
    ]
    if not requests and not new_partitions:
        return SkipReason("no new or changed models")
    cursor = {**seen, **{m.reference: m.version for m in registered}}
    return SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[model_partitions.build_add_request(new_partitions)] if new_partitions else [],
        cursor=json.dumps(cursor, sort_keys=True),
    )
