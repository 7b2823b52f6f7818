"""Partitions shared by every TAG asset.

Both dimensions are dynamic: models are registered and topology snapshots
arrive at run time (sensors add the keys). A model key is a model reference as
`tag_core.capture.models.resolve_model` takes it (`mlp`, `small_cnn[image_size=16]`,
`path/to/file.py:function`); a topology key names a snapshot.
"""

from __future__ import annotations

from dagster import DynamicPartitionsDefinition, MultiPartitionsDefinition

model_partitions = DynamicPartitionsDefinition(name="model")
topology_partitions = DynamicPartitionsDefinition(name="topology")

# For plan-level assets (deployment_plan, sfb_decisions, distributed_graph).
# Dagster's DuckDB IO manager cannot store these (dagster issue 32631): such
# assets write through DuckDBResource and return MaterializeResult.
model_topology_partitions = MultiPartitionsDefinition({"model": model_partitions, "topology": topology_partitions})
