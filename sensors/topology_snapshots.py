"""`topology_snapshot_sensor`: plan for every topology snapshot dropped into TAG_TOPOLOGY_DIR.

A new or changed snapshot (by content hash) adds or keeps its `topology`
partition and requests a `cluster_topology` run whose run key carries the
hash; eager automation then re-plans every registered model on it. A deleted
snapshot keeps its partition and history: a `cluster_topology` run marks it
retired in DuckDB. The sensor itself never opens DuckDB (one process holds the
file at a time: only runs write it, each in one short transaction).
"""

import json
import os

from dagster import (
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.cluster import cluster_topology
from tag_core.cluster import DEFAULT_SETTLE_S, scan_snapshots, topology_directory
from tag_pipelines.partitions import topology_partitions


def settle_seconds() -> float:
    return float(os.environ.get("TAG_TOPOLOGY_SETTLE_S", DEFAULT_SETTLE_S))


@sensor(
    name="topology_snapshot_sensor",
    asset_selection=[cluster_topology],
    minimum_interval_seconds=10,
    default_status=DefaultSensorStatus.RUNNING,
)
def topology_snapshot_sensor(context: SensorEvaluationContext):
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    directory = topology_directory()
    scans = scan_snapshots(directory, settle_s=settle_seconds())
    known = set(context.instance.get_dynamic_partitions(topology_partitions.name))
    new_partitions, requests = [], []
    current: dict[str, str] = {}
    for scan in scans:
        if scan.status != "ready":
            if scan.status == "settling":
                context.log.info(f"{scan.path.name}: {scan.reason}")
                if scan.name in seen:
                    current[scan.name] = seen[scan.name]  # still there: not retired
            else:
                context.log.warning(f"skipping {scan.path.name}: {scan.reason}")
            continue
        current[scan.name] = scan.content_hash
        if scan.name not in known:
            new_partitions.append(scan.name)
        if seen.get(scan.name) != scan.content_hash:
            requests.append(RunRequest(run_key=f"topology:{scan.name}:{scan.content_hash}", partition_key=scan.name,
                                       tags={"tag/topology_hash": scan.content_hash}))
    for name, content_hash in seen.items():
        if name not in current and not name.startswith("retired:"):
            # Gone from the directory: record retirement once; the partition and its plans stay.
            current[f"retired:{name}"] = content_hash
            requests.append(RunRequest(run_key=f"retire:{name}:{content_hash}", partition_key=name,
                                       tags={"tag/retire": "true"}))
    for name, content_hash in seen.items():  # remember retirements, unless the snapshot came back
        if name.startswith("retired:") and name.removeprefix("retired:") not in current:
            current[name] = content_hash
    if not requests and not new_partitions:
        return SkipReason(f"no new or changed snapshots in {directory}")
    return SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[topology_partitions.build_add_request(new_partitions)] if new_partitions else [],
        cursor=json.dumps(current, sort_keys=True),
    )
