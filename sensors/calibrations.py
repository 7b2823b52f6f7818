"""`calibration_sensor`: re-plan a topology when a calibration of it is dropped into TAG_CALIBRATION_DIR.

A new or changed `<topology>.json` (by calibration hash) of a known topology partition requests a
`calibration` run; a new calibration changes that asset's data version, and eager automation re-plans
every model on the topology. Like the snapshot sensor, it never opens DuckDB.
"""

import json

from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from assets.cluster import calibration
from tag_core.cluster import calibration_directory, scan_calibrations
from tag_pipelines.partitions import topology_partitions

from .topology_snapshots import settle_seconds


@sensor(
    name="calibration_sensor",
    asset_selection=[calibration],
    minimum_interval_seconds=10,
    default_status=DefaultSensorStatus.RUNNING,
)
def calibration_sensor(context: SensorEvaluationContext):
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    directory = calibration_directory()
    known = set(context.instance.get_dynamic_partitions(topology_partitions.name))
    requests = []
    current = dict(seen)
    for scan in scan_calibrations(directory, settle_s=settle_seconds()):
        if scan.status != "ready":
            if scan.status != "settling":
                context.log.warning(f"skipping {scan.path.name}: {scan.reason}")
            continue
        if scan.name not in known:
            context.log.warning(f"skipping {scan.path.name}: no topology partition {scan.name!r} (drop its "
                                "snapshot into TAG_TOPOLOGY_DIR first)")
            continue
        if seen.get(scan.name) != scan.content_hash:
            current[scan.name] = scan.content_hash
            requests.append(RunRequest(run_key=f"calibration:{scan.name}:{scan.content_hash}", partition_key=scan.name,
                                       tags={"tag/calibration_hash": scan.content_hash}))
    if not requests:
        return SkipReason(f"no new or changed calibrations in {directory}")
    return SensorResult(run_requests=requests, cursor=json.dumps(current, sort_keys=True))
