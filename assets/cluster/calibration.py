"""The calibration that plans on a topology apply: the cost model's terms measured on its runtime."""

# No `from __future__ import annotations`: Dagster checks the `context` annotation
# as a real type and rejects the string form.

import dataclasses

from dagster import AssetExecutionContext, DataVersion, MaterializeResult, MetadataValue, asset
from dagster_duckdb import DuckDBResource

from tag_core.cluster import calibration_directory, recorded_topology
from tag_core.cluster.calibration import save_to_store
from tag_core.cluster.calibration_json import read_calibration_file
from tag_core.simulate import CommModel
from tag_core.simulate.comm import comm_for
from tag_pipelines.errors import input_errors_as_failures
from tag_pipelines.partitions import topology_partitions
from tag_pipelines.resources import open_store

from .assets import cluster_topology


@asset(partitions_def=topology_partitions, deps=[cluster_topology], group_name="plan", kinds={"duckdb"})
def calibration(context: AssetExecutionContext, duckdb: DuckDBResource) -> MaterializeResult:
    """`$TAG_CALIBRATION_DIR/<key>.json` (default ./calibrations, as `tag calibrate --export` writes it) when
    there is one, stored; then the newest calibration of this very snapshot, which plans apply. Without one
    the cost model keeps its defaults, and the metadata says why."""
    with input_errors_as_failures():
        key = context.partition_key
        path = calibration_directory() / f"{key}.json"
        with open_store(duckdb) as conn:
            topology = recorded_topology(conn, key)
            if path.is_file():
                dropped = read_calibration_file(path, "calibration")
                if dropped.topology_hash == topology.content_hash():
                    save_to_store(conn, dataclasses.replace(dropped, source="import"))
                else:
                    context.log.warning(f"{path} was measured for snapshot {dropped.topology_hash} of {key}, "
                                        f"not the current one ({topology.content_hash()}): not applied")
            comm, uncalibrated = comm_for(conn, topology)
    metadata = {"applied": comm.calibrated, "topology_hash": topology.content_hash()}
    if comm.calibrated:
        metadata.update(calibration_hash=comm.calibration_hash, terms=MetadataValue.md(_terms_table(comm)))
    else:
        metadata["why"] = uncalibrated
    version = comm.calibration_hash or f"uncalibrated:{topology.content_hash()}"
    return MaterializeResult(metadata=metadata, data_version=DataVersion(version))


def _terms_table(comm: CommModel) -> str:
    rows = [f"| transfer latency, {link} | {latency * 1e3:.3f} ms |"
            for link, latency in (("intra", comm.intra_latency_s), ("inter", comm.inter_latency_s))]
    rows += [f"| bandwidth, {link} | {gbps:.2f} Gbit/s |" for link, gbps in sorted(comm.link_gbps.items())]
    rows += [f"| {kind}, {link}, {size} devices | {fit.latency_s * 1e3:.3f} ms + {fit.gbps:.2f} Gbit/s |"
             for (kind, link, size), fit in sorted(comm.fits.items())]
    rows += [f"| step launch, {tasks} task(s) | {seconds * 1e3:.3f} ms |"
             for tasks, seconds in sorted(comm.step_s_by_tasks.items())]
    return "| term | measured |\n|---|---:|\n" + "\n".join(rows)
