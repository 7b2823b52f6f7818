"""The tables and views of TAG's database, in SQL that DuckDB and PostgreSQL both run (PostgreSQL spells
the types its own way: `postgres.schema_statement`). `migrations.upgrade` creates or migrates them."""

# 2: variables.position (their capture order, which DuckDB's rowid held).
SCHEMA_VERSION = 2

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS schema_info (version INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS models (
        model TEXT PRIMARY KEY, batch_size INTEGER NOT NULL, source_hash TEXT, graph_hash TEXT NOT NULL,
        graph_file TEXT, step_file TEXT, summary JSON, captured_at TIMESTAMP DEFAULT current_timestamp)""",
    """CREATE TABLE IF NOT EXISTS ops (
        model TEXT NOT NULL, idx INTEGER NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL,
        output_bytes BIGINT, flops BIGINT, parameter_bytes BIGINT, is_parameter BOOLEAN, is_gradient BOOLEAN,
        is_apply BOOLEAN, is_input BOOLEAN, batch_scaled BOOLEAN, variable TEXT, other_variables JSON,
        PRIMARY KEY (model, idx))""",
    # Databases made before other_variables existed gain it (their rows read as none).
    "ALTER TABLE ops ADD COLUMN IF NOT EXISTS other_variables JSON",
    """CREATE TABLE IF NOT EXISTS edges (
        model TEXT NOT NULL, src INTEGER NOT NULL, dst INTEGER NOT NULL, bytes BIGINT, batch BOOLEAN, tensor TEXT)""",
    """CREATE TABLE IF NOT EXISTS variables (
        model TEXT NOT NULL, name TEXT NOT NULL, shape JSON, dtype TEXT, bytes BIGINT, trainable BOOLEAN,
        owner TEXT, gradient_op TEXT, position BIGINT)""",
    """CREATE TABLE IF NOT EXISTS op_profiles (
        model TEXT NOT NULL, op TEXT NOT NULL, device_type TEXT NOT NULL, batch_size INTEGER NOT NULL,
        run INTEGER NOT NULL, time_us DOUBLE NOT NULL, host TEXT, tf_version TEXT,
        profiled_at TIMESTAMP DEFAULT current_timestamp)""",
    # The executor's cost of running the op beyond its traced time (tag_core.profile.profiler): NULL where not
    # measured (databases made before it existed, imported CSVs without it, GPUs), 0 where TF did not run it.
    "ALTER TABLE op_profiles ADD COLUMN IF NOT EXISTS overhead_us DOUBLE",
    # What the profiler measured of each profiled step as a whole, beside the per-op rows.
    """CREATE TABLE IF NOT EXISTS profile_steps (
        model TEXT NOT NULL, device_type TEXT NOT NULL, batch_size INTEGER NOT NULL, run INTEGER NOT NULL,
        step_us DOUBLE, kernel_us DOUBLE, other_kernel_us DOUBLE, nodes INTEGER, graph_nodes INTEGER,
        dispatch_us DOUBLE, launch_us DOUBLE, threads INTEGER, grappler BOOLEAN, trace_level TEXT, host TEXT,
        tf_version TEXT, profiled_at TIMESTAMP DEFAULT current_timestamp)""",
    # Planning (tag plan, op_groups / cluster_topology / deployment_plan assets).
    """CREATE TABLE IF NOT EXISTS op_group_sets (
        model TEXT PRIMARY KEY, graph_hash TEXT NOT NULL, groups_hash TEXT NOT NULL, num_groups INTEGER NOT NULL,
        seed INTEGER NOT NULL, groups JSON NOT NULL, created_at TIMESTAMP DEFAULT current_timestamp)""",
    """CREATE TABLE IF NOT EXISTS topology_snapshots (
        topology TEXT NOT NULL, content_hash TEXT NOT NULL, snapshot JSON NOT NULL, source_file TEXT,
        recorded_at TIMESTAMP DEFAULT current_timestamp, PRIMARY KEY (topology, content_hash))""",
    """CREATE TABLE IF NOT EXISTS plans (
        plan_id TEXT PRIMARY KEY, model TEXT NOT NULL, topology TEXT NOT NULL, source TEXT,
        tag_time_s DOUBLE, dp_nccl_time_s DOUBLE, speedup_vs_dp_nccl DOUBLE, oom BOOLEAN,
        graph_hash TEXT, profile_hash TEXT, groups_hash TEXT, topology_hash TEXT, checkpoint_hash TEXT,
        code_version TEXT, seed INTEGER, budget JSON, warm_start_from TEXT, plan JSON NOT NULL,
        created_at TIMESTAMP DEFAULT current_timestamp)""",
    # Databases made before calibrations existed gain the column (their plans read as uncalibrated).
    "ALTER TABLE plans ADD COLUMN IF NOT EXISTS calibration_hash TEXT",
    """CREATE TABLE IF NOT EXISTS fusion_plans (
        model TEXT PRIMARY KEY, graph_hash TEXT NOT NULL, patterns INTEGER, ops_fused INTEGER,
        kernels_before INTEGER, kernels_after INTEGER, plan JSON NOT NULL, created_at TIMESTAMP DEFAULT current_timestamp)""",
    """CREATE TABLE IF NOT EXISTS sfb_decisions (
        model TEXT NOT NULL, topology TEXT NOT NULL, plan_id TEXT NOT NULL, variable TEXT NOT NULL,
        gradient_op TEXT NOT NULL, op_types JSON, duplicated JSON, gathered JSON, estimated_saving_s DOUBLE,
        sync_saved_s DOUBLE, extra_compute_s DOUBLE, gather_s DOUBLE, PRIMARY KEY (model, topology, variable))""",
    """CREATE TABLE IF NOT EXISTS topology_retirements (
        topology TEXT PRIMARY KEY, content_hash TEXT, retired_at TIMESTAMP DEFAULT current_timestamp)""",
    # Calibrations of a topology snapshot's runtime: fitted terms (JSON) and the samples they were fitted to.
    """CREATE TABLE IF NOT EXISTS calibrations (
        calibration_hash TEXT PRIMARY KEY, topology TEXT NOT NULL, topology_hash TEXT NOT NULL, source TEXT,
        host TEXT, code_version TEXT, terms JSON NOT NULL, created_at TIMESTAMP DEFAULT current_timestamp)""",
    """CREATE TABLE IF NOT EXISTS calibration_samples (
        calibration_hash TEXT NOT NULL, kind TEXT NOT NULL, link TEXT, group_size INTEGER, bytes BIGINT,
        run INTEGER NOT NULL, seconds DOUBLE NOT NULL)""",
    # Steps of an emitted graph timed on a real runtime, beside what the simulator predicted for them.
    """CREATE TABLE IF NOT EXISTS measured_steps (
        model TEXT NOT NULL, topology TEXT NOT NULL, strategy TEXT NOT NULL, plan_id TEXT, graph_hash TEXT,
        topology_hash TEXT, calibration_hash TEXT, batch_size INTEGER, steps INTEGER NOT NULL, predicted_s DOUBLE,
        measured_s DOUBLE NOT NULL, spread_s DOUBLE, host TEXT, measured_at TIMESTAMP DEFAULT current_timestamp)""",
    # Runs of `tag train`: what trained (plan, data), how far and how well, and where its checkpoint and model are.
    """CREATE TABLE IF NOT EXISTS training_runs (
        run_id TEXT PRIMARY KEY, model TEXT NOT NULL, topology TEXT NOT NULL, strategy TEXT, plan_id TEXT,
        graph_hash TEXT, topology_hash TEXT, profile_hash TEXT, calibration_hash TEXT, data TEXT, data_hash TEXT,
        validation_hash TEXT, batch_size INTEGER, first_step BIGINT, steps BIGINT, status TEXT NOT NULL,
        final_loss DOUBLE, best_loss DOUBLE, validation JSON, samples_per_s DOUBLE, input_share DOUBLE,
        checkpoint TEXT, model_file TEXT, run_dir TEXT, wall_s DOUBLE, resumed_from TEXT, loss_curve JSON,
        created_at TIMESTAMP DEFAULT current_timestamp)""",
    # Which snapshot, profile set, groups and checkpoint made each plan, and whether each is still current.
    """CREATE OR REPLACE VIEW plan_lineage AS
        SELECT p.plan_id, p.model, p.topology, p.created_at, p.source, p.tag_time_s, p.speedup_vs_dp_nccl,
               p.graph_hash, p.graph_hash = m.graph_hash AS graph_is_current,
               p.profile_hash, p.groups_hash, p.groups_hash = g.groups_hash AS groups_are_current,
               p.topology_hash, s.source_file AS snapshot_file, s.recorded_at AS snapshot_recorded_at,
               r.retired_at AS topology_retired_at, p.checkpoint_hash, p.code_version, p.seed, p.budget,
               p.warm_start_from, p.calibration_hash
        FROM plans p
        LEFT JOIN models m ON m.model = p.model
        LEFT JOIN op_group_sets g ON g.model = p.model
        LEFT JOIN topology_snapshots s ON s.topology = p.topology AND s.content_hash = p.topology_hash
        LEFT JOIN topology_retirements r ON r.topology = p.topology""",
]
