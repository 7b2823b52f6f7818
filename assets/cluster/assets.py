"""Topology snapshots: each `$TAG_TOPOLOGY_DIR/<key>.json` (or probe folder `<key>.probes/`), validated and
recorded in the store."""

# No `from __future__ import annotations`: Dagster checks the `context` annotation
# as a real type and rejects the string form.

import re

from dagster import AssetExecutionContext, DataVersion, MaterializeResult, MetadataValue, asset
from dagster_duckdb import DuckDBResource

from tag_core import store
from tag_core.cluster import load_snapshot, snapshot_source, topology_directory
from tag_core.errors import TagInputError
from tag_pipelines.errors import input_errors_as_failures
from tag_pipelines.partitions import topology_partitions
from tag_pipelines.resources import open_store

_SNAPSHOT_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@asset(partitions_def=topology_partitions, group_name="plan", kinds={"duckdb"})
def cluster_topology(context: AssetExecutionContext, duckdb: DuckDBResource) -> MaterializeResult:
    """The validated snapshot `$TAG_TOPOLOGY_DIR/<key>.json` (default ./topologies), recorded in DuckDB."""
    with input_errors_as_failures():
        key = context.partition_key
        if not _SNAPSHOT_KEY.match(key):
            raise TagInputError("topology", f"{key!r} is not a snapshot name (letters, digits, '_', '-', '.')")
        directory = topology_directory().resolve()
        path = snapshot_source(directory, key).resolve()
        if path.parent != directory:  # a symlink out of the directory
            raise TagInputError("topology", f"{key}.json leaves {directory}")
        if not path.is_file() and not path.is_dir():
            with open_store(duckdb) as conn:
                known = store.latest_topology_snapshot(conn, key)
                if known is None:
                    raise TagInputError("topology", f"no snapshot {path}")
                # Deleted: retire it; the partition, snapshots and plans keep their history.
                store.retire_topology(conn, key, known["content_hash"])
            context.log.info(f"{path} is gone: topology {key!r} retired")
            return MaterializeResult(metadata={"retired": True, "content_hash": known["content_hash"]},
                                     data_version=DataVersion(f"retired:{known['content_hash']}"))
        topology = load_snapshot(path, key)
        with open_store(duckdb) as conn:
            store.save_topology_snapshot(conn, key, topology.content_hash(), topology.to_dict(), str(path))
            store.reinstate_topology(conn, key)
    return MaterializeResult(
        metadata={
            "machines": topology.num_machines,
            "devices": topology.num_devices,
            "gpu_types": MetadataValue.json(topology.gpu_types()),
            "inter_gbps": float(topology.inter_gbps),
            "links": len(topology.links),
            "content_hash": topology.content_hash(),
            "source_file": MetadataValue.path(str(path)),
        },
        data_version=DataVersion(topology.content_hash()),
    )
