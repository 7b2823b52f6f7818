"""TAG's store: its schema and every SQL statement it runs, on DuckDB (a file, the default) or PostgreSQL
(TAG_STORE=postgresql://…). No SQL lives anywhere else.

In: an open connection (`connect` for the CLI and, through their resource, for assets)
and plain rows: dicts, tuples and DataFrames. Out: rows again. The store knows no stage's
types, so every stage may use it. Each write is one transaction.
"""

from .connection import (
    CONNECT_CONFIG,
    StoreBusy,
    connect,
    connect_if_present,
    default_database,
    ensure_schema,
    location,
    store_wait_s,
    tag_home,
    transaction,
)
from .graphs import (
    captured_model,
    list_captured_models,
    load_op_groups,
    op_graph_rows,
    save_op_graph,
    save_op_groups,
)
from .measurements import (
    CALIBRATION_COLUMNS,
    MEASURED_STEP_COLUMNS,
    SAMPLE_COLUMNS,
    calibration_samples,
    latest_calibration,
    list_calibrations,
    load_calibration,
    load_measured_steps,
    predicted_and_measured,
    save_calibration,
    save_measured_step,
)
from .plans import (
    PLAN_COLUMNS,
    SFB_COLUMNS,
    current_plans,
    has_plan,
    latest_plan,
    latest_topology_snapshot,
    load_fusion_plan,
    load_plans,
    load_sfb_decisions,
    plan_lineage,
    reinstate_topology,
    retire_topology,
    retired_topologies,
    save_fusion_plan,
    save_plan,
    save_plan_with_snapshot,
    save_sfb_decisions,
    save_topology_snapshot,
)
from .profiles import PROFILE_COLUMNS, load_profiles, profile_set_hash, profile_summary, replace_profiles
from .schema import SCHEMA, SCHEMA_VERSION
from .training import TRAINING_COLUMNS, load_training_runs, save_training_run, trained_lineage
from .transfer import TABLES, copy_tables

__all__ = [
    "CALIBRATION_COLUMNS", "MEASURED_STEP_COLUMNS", "SAMPLE_COLUMNS", "calibration_samples", "latest_calibration",
    "list_calibrations", "load_calibration", "load_measured_steps", "predicted_and_measured", "save_calibration",
    "save_measured_step",
    "CONNECT_CONFIG", "StoreBusy", "has_plan", "save_plan_with_snapshot", "store_wait_s", "PLAN_COLUMNS", "PROFILE_COLUMNS", "SCHEMA", "SCHEMA_VERSION", "SFB_COLUMNS",
    "captured_model", "connect", "current_plans", "default_database", "ensure_schema", "latest_plan",
    "latest_topology_snapshot", "list_captured_models", "load_fusion_plan", "load_op_groups", "load_plans",
    "load_profiles", "load_sfb_decisions", "op_graph_rows", "plan_lineage", "profile_set_hash", "profile_summary",
    "reinstate_topology", "replace_profiles", "retire_topology", "retired_topologies", "save_fusion_plan",
    "save_op_graph", "save_op_groups", "save_plan", "save_sfb_decisions", "save_topology_snapshot", "tag_home",
    "transaction", "TABLES", "copy_tables", "connect_if_present", "location", "TRAINING_COLUMNS", "load_training_runs", "save_training_run", "trained_lineage",
]
