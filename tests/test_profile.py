"""The profiler and the profile CSV round trip, against a real TF session and DuckDB."""

from __future__ import annotations

import numpy as np
import pytest
from shared_stores import building, copy_store

from tag_core import store
from tag_core.capture import load_op_graph, resolve_model
from tag_core.errors import TagInputError
from tag_core.profile import export_profiles, import_profiles, profile_model, read_profile_csv

TINY = "small_cnn[image_size=8,classes=4]"


@pytest.fixture(scope="module")
def profiled_store(tmp_path_factory):
    """TINY captured and profiled at batch sizes 2 and 4 (3 runs each), once for this module."""
    with building(tmp_path_factory.mktemp("profiled") / "tag_home") as home:
        with store.connect() as conn:
            profile_model(conn, resolve_model(TINY), [2, 4], runs=3, warmup=1, show_progress=False)
    return home


@pytest.fixture
def profiled(profiled_store, tag_home):
    conn = store.connect(copy_store(profiled_store, tag_home))
    yield conn, resolve_model(TINY)
    conn.close()


@pytest.mark.slow
def test_every_op_gets_one_time_per_run_and_batch(profiled):
    conn, spec = profiled
    graph = load_op_graph(conn, spec.name)
    counts = conn.execute(
        "SELECT batch_size, op, count(*) FROM op_profiles WHERE model = ? GROUP BY ALL", [spec.name]
    ).fetchall()
    assert {b for b, _, _ in counts} == {2, 4}
    assert {n for _, _, n in counts} == {3}
    assert len(counts) == 2 * len(graph.ops)
    frame = store.load_profiles(conn, spec.name)
    assert (frame.time_us >= 0).all() and frame.time_us.sum() > 0
    assert set(frame.device_type) == {"cpu"} and frame.tf_version.notna().all() and frame.host.notna().all()
    # Compute-heavy ops have real times.
    conv = frame[frame.op.str.contains("Conv2DBackpropFilter")]
    assert (conv.time_us > 0).all()


@pytest.mark.slow  # a second profiling child (TF start-up): about 5 s
def test_reprofiling_replaces_rows(profiled):
    conn, spec = profiled
    before = conn.execute("SELECT count(*) FROM op_profiles").fetchone()[0]
    profile_model(conn, spec, [2], runs=2, warmup=0, show_progress=False)
    rows = dict(conn.execute("SELECT batch_size, count(DISTINCT run) FROM op_profiles GROUP BY ALL").fetchall())
    assert rows == {2: 2, 4: 3}
    steps = dict(conn.execute("SELECT batch_size, count(*) FROM profile_steps GROUP BY ALL").fetchall())
    assert steps == {2: 2, 4: 3}
    assert conn.execute("SELECT count(*) FROM op_profiles").fetchone()[0] < before


def test_csv_round_trip(profiled, tmp_path):
    conn, spec = profiled
    path = tmp_path / "profiles.csv"
    path.write_text(export_profiles(conn, spec.name).replace(",cpu,", ",V100-32GB,"))
    imported = import_profiles(conn, path)
    assert imported == conn.execute("SELECT count(*) FROM op_profiles WHERE device_type = 'cpu'").fetchone()[0]
    gpu = store.load_profiles(conn, spec.name, "V100-32GB")
    cpu = store.load_profiles(conn, spec.name, "cpu")
    assert len(gpu) == len(cpu) and gpu.time_us.sum() == pytest.approx(cpu.time_us.sum())
    assert gpu.overhead_us.notna().all() and gpu.overhead_us.sum() == pytest.approx(cpu.overhead_us.sum())


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("", "not a well-formed CSV"),
        ("model,op,device_type,batch_size,run\n", "missing column(s) time_us"),
        ("model,op,device_type,batch_size,run,time_us\n", "no rows"),
        ("model,op,device_type,batch_size,run,time_us,colour\nm,a,cpu,1,0,1.0,red\n", "unknown column(s) colour"),
        ("model,op,device_type,batch_size,run,time_us\nm,a,cpu,0,0,1.0\n", ":2.batch_size: must be at least 1"),
        ("model,op,device_type,batch_size,run,time_us\nm,a,cpu,1,0,fast\n", ":2.time_us: must be a number"),
        ("model,op,device_type,batch_size,run,time_us\nm,a,cpu,1,0,-4\n", ":2.time_us: must be a finite number"),
        ("model,op,device_type,batch_size,run,time_us\nm,a,cpu,1,0,nan\n", ":2.time_us: must be a finite number"),
        ("model,op,device_type,batch_size,run,time_us\nm,,cpu,1,0,3\n", ":2.op: must not be empty"),
        ('model,op,device_type,batch_size,run,time_us\nm,"a,cpu,1,0,3\n', "not a well-formed CSV"),
        ("model,op,device_type,batch_size,run,time_us\nm,a,cpu,1,0,3\nm,a,cpu,1,0,4\n", ":3: repeats"),
    ],
)
def test_bad_csv_is_refused_and_nothing_is_written(tag_home, tmp_path, content, fragment):
    conn = store.connect()
    good = tmp_path / "good.csv"
    good.write_text("model,op,device_type,batch_size,run,time_us\nm,a,T4,2,0,5.5\nm,b,T4,2,0,1.0\n")
    assert import_profiles(conn, good) == 2
    before = conn.execute("SELECT count(*), sum(time_us) FROM op_profiles").fetchone()
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(TagInputError) as error:
        import_profiles(conn, path)
    assert fragment in str(error.value) and "\n" not in str(error.value)
    assert conn.execute("SELECT count(*), sum(time_us) FROM op_profiles").fetchone() == before


def test_unreadable_csv(tmp_path):
    with pytest.raises(TagInputError, match="cannot read the file"):
        read_profile_csv(tmp_path / "absent.csv")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(TagInputError, match="cannot read the file|not a well-formed"):
        read_profile_csv(binary)


def test_profile_arguments_are_checked(tag_home):
    conn = store.connect()
    spec = resolve_model("mlp[features=4,hidden=4]")
    for kwargs, fragment in [
        (dict(batch_sizes=[0]), "batch_sizes"),
        (dict(batch_sizes=[2], runs=0), "runs"),
        (dict(batch_sizes=[2], warmup=-1), "warmup"),
    ]:
        with pytest.raises(TagInputError, match=fragment):
            profile_model(conn, spec, show_progress=False, **kwargs)
    assert conn.execute("SELECT count(*) FROM op_profiles").fetchone()[0] == 0


# ---- the executor's overhead beyond the traced kernels (issue 20: the one-device bias) ----------------


def test_profile_records_the_executor_overhead_of_every_op(profiled):
    conn, spec = profiled
    graph = load_op_graph(conn, spec.name)
    frame = store.load_profiles(conn, spec.name, "cpu")
    assert frame.overhead_us.notna().all()
    # Fed inputs are not run by TF: no kernel, no overhead (the old profile floored them at 1 µs).
    inputs = {op.name for op in graph.ops if op.is_input}
    fed = frame[frame.op.isin(inputs)]
    assert len(fed) and (fed.time_us == 0).all() and (fed.overhead_us == 0).all()
    # Every op that ran carries a share of the executor's work; within a run, shares go by nodes run, so ops
    # that ran once carry the same one.
    ran = frame[~frame.op.isin(inputs) & (frame.overhead_us != 0)]
    assert len(ran) > 0.8 * (len(frame) - len(fed))
    for _, one_run in ran.groupby(["batch_size", "run"]):
        assert one_run.overhead_us.nunique() <= 4


def test_step_records_account_for_the_whole_untraced_step(profiled):
    conn, spec = profiled
    from tag_core.store.profiles import load_profile_steps

    steps = load_profile_steps(conn, spec.name, "cpu")
    assert len(steps) == 6 and set(steps.batch_size) == {2, 4}
    # Measured as the runtime runs a device here: one pinned thread, Grappler on, a software trace.
    assert (steps.threads == 1).all() and steps.grappler.all() and (steps.trace_level == "software").all()
    assert (steps.step_us > 0).all() and (steps.launch_us > 0).all() and (steps.kernel_us > 0).all()
    assert (steps.nodes > steps.graph_nodes).all()  # constants and handles run outside the OpGraph
    frame = store.load_profiles(conn, spec.name, "cpu")
    for _, step in steps.iterrows():
        rows = frame[(frame.batch_size == step.batch_size) & (frame.run == step.run)]
        assert rows.time_us.sum() == pytest.approx(step.kernel_us)
        # The per-op overheads add up to what the trace left out: untraced step - launch - traced op time.
        assert rows.overhead_us.sum() == pytest.approx(step.step_us - step.launch_us - step.kernel_us, abs=1e-6)
        assert step.dispatch_us == pytest.approx((step.step_us - step.launch_us - step.kernel_us
                                                  - step.other_kernel_us) / step.nodes)
    # Measured on every run, not a constant: the runs' figures differ.
    assert steps.dispatch_us.nunique() == len(steps)


def test_the_cost_model_adds_the_measured_overhead_per_op(profiled):
    conn, spec = profiled
    from tag_core.cluster import CATALOG, Machine, Topology
    from tag_core.simulate import ComputeModel, Simulator, Strategy
    from tag_core.simulate.cost import GPU_LAUNCH_FLOOR_S

    graph = load_op_graph(conn, spec.name)
    frame = store.load_profiles(conn, spec.name, "cpu")
    model = ComputeModel(graph, frame)
    medians = frame.groupby(["op", "batch_size"])[["time_us", "overhead_us"]].median()
    # Scaled per batch so that the ops add up to the median run's step.
    per_run = (frame.time_us + frame.overhead_us).groupby([frame.batch_size, frame.run]).sum()
    run_step = per_run.groupby(level=0).median()
    summed = medians.sum(axis=1).groupby(level="batch_size").sum()
    medians = medians.mul((run_step / summed).reindex(medians.index.get_level_values("batch_size")).to_numpy(), axis=0)
    names = [op.name for op in graph.ops]
    # Ops whose work does not grow with the batch take their median over the profiled batches.
    flat = medians.groupby("op").median().reindex(names)
    for batch in (2, 4):
        at = medians.xs(batch, level="batch_size").reindex(names)
        kernel = at.time_us.where(model.batch_scaled, flat.time_us)
        overhead = at.overhead_us.where(model.batch_scaled, flat.overhead_us)
        expected = (kernel + overhead).clip(lower=0).to_numpy()
        # ... and the ops are scaled to add up to the step the profile measured at that batch.
        expected *= run_step[batch] * 1e-6 / expected.sum()
        assert model.times(CATALOG["cpu"], batch) == pytest.approx(expected, abs=1e-12)
        assert model.times(CATALOG["cpu"], batch).sum() == pytest.approx(run_step[batch] * 1e-6, rel=1e-9)
    # Without the overhead the same profile gives the kernels alone, floored at 1 µs as before.
    kernels = ComputeModel(graph, frame.drop(columns="overhead_us")).times(CATALOG["cpu"], 4)
    with_overhead = model.times(CATALOG["cpu"], 4)
    assert with_overhead.sum() != pytest.approx(kernels.sum())
    # The one-device step is the sum over ops: the simulator sees the term through the same ComputeModel.
    host = Topology("host", (Machine("host", CATALOG["cpu"], 1, 100.0),), 100.0)
    sim = Simulator(graph, host, compute=model, batch_size=4)
    single = sim.run(Strategy.uniform(len(graph.ops), 1, 1, "allreduce")).iteration_time_s
    assert single == pytest.approx(with_overhead.sum(), rel=1e-9)
    # Another device type gets the kernels scaled by roofline, never the CPU executor's overhead.
    v100 = CATALOG["V100-32GB"]
    # (Its kernels carry the profile's step factor, so they differ from a kernels-only profile's by one ratio.)
    with_cpu_overhead = model.times(v100, 4)
    kernels_only = ComputeModel(graph, frame.drop(columns="overhead_us")).times(v100, 4)
    above = (with_cpu_overhead > GPU_LAUNCH_FLOOR_S) & (kernels_only > GPU_LAUNCH_FLOOR_S)
    ratio = with_cpu_overhead[above] / kernels_only[above]
    # (On a fast machine the model's few-microsecond kernels leave as few as one op above the floor.)
    assert above.sum() >= 1 and ratio == pytest.approx(np.full(above.sum(), np.median(ratio)), rel=1e-9)
    # The rest sit at the floor in one of the two: the other is at most the ratio above it.
    r = float(np.median(ratio))
    high = max(r, 1 / r) * GPU_LAUNCH_FLOOR_S * (1 + 1e-9)
    rest = np.concatenate([with_cpu_overhead[~above], kernels_only[~above]])
    assert (rest >= GPU_LAUNCH_FLOOR_S * (1 - 1e-9)).all() and (rest <= high).all()


def test_profiling_pins_to_the_runtimes_first_core_with_one_thread():
    import os

    from tag_core.profile.profiler import RUNTIME_THREADS, runtime_cores

    assert RUNTIME_THREADS == 1
    assert runtime_cores(1) == [min(os.sched_getaffinity(0))]
    assert runtime_cores(0) is None and runtime_cores(None) is None


def test_profiles_run_with_the_thread_pools_of_a_server_of_the_runtime():
    import tensorflow as tf

    from tag_core.profile.timing import config
    from tag_core.runtime.local_cluster import server_config

    # A step on one core takes longer with two inter-op threads than with one: the profile has to have them.
    profiled, served = config(tf, 1), server_config(threads=1)
    assert (profiled.intra_op_parallelism_threads, profiled.inter_op_parallelism_threads) == (1, 2)
    assert served.inter_op_parallelism_threads == profiled.inter_op_parallelism_threads
    assert served.intra_op_parallelism_threads == profiled.intra_op_parallelism_threads
    assert config(tf, 0).inter_op_parallelism_threads == 0  # TF's defaults


def test_nodes_outside_the_op_graph_belong_to_the_op_they_are_scoped_under():
    from tag_core.profile.timing import owner

    known, cache = {"dense/MatMul", "adam/ReadVariableOp", "while"}, {}
    assert owner("dense/MatMul", known, cache) == "dense/MatMul"
    assert owner("adam/ReadVariableOp/resource", known, cache) == "adam/ReadVariableOp"
    assert owner("while/body/_1/dense/MatMul", known, cache) == "while"
    assert owner("Const_3", known, cache) is None and owner("_SOURCE", known, cache) is None
    assert owner("dense/ArithmeticOptimizer/AddOpsRewrite_Add", known, cache) is None


def test_op_overheads_share_out_the_whole_left_out_time():
    import numpy as np

    from tag_core.profile import op_overheads

    execs = np.array([1, 2, 0, 1])  # the third op did not run
    out = op_overheads(execs, dispatch_us=1.5, other_kernel_us=8.0, other_nodes=4)
    # 8 nodes ran in all (4 of them OpGraph op executions): dispatch for all of them plus the others' kernels.
    assert out.sum() == pytest.approx(8 * 1.5 + 8.0)
    assert out[2] == 0 and out[1] == pytest.approx(2 * out[0])
    assert np.isnan(op_overheads(execs, None, 8.0, 4)).all()  # not measured (GPU): no term


def test_old_databases_gain_the_overhead_column(tmp_path):
    import duckdb

    path = tmp_path / "old.duckdb"
    old = duckdb.connect(str(path))
    old.execute("""CREATE TABLE op_profiles (
        model TEXT NOT NULL, op TEXT NOT NULL, device_type TEXT NOT NULL, batch_size INTEGER NOT NULL,
        run INTEGER NOT NULL, time_us DOUBLE NOT NULL, host TEXT, tf_version TEXT,
        profiled_at TIMESTAMP DEFAULT current_timestamp)""")
    old.execute("INSERT INTO op_profiles VALUES ('m', 'a', 'cpu', 2, 0, 5.0, NULL, NULL, NULL)")
    old.close()
    conn = store.connect(path)
    frame = store.load_profiles(conn, "m")
    assert frame.time_us.tolist() == [5.0] and frame.overhead_us.isna().all()
    from tag_core.store.profiles import load_profile_steps

    assert load_profile_steps(conn, "m").empty
