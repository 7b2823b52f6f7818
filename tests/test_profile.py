"""The profiler and the profile CSV round trip, against a real TF session and DuckDB."""

from __future__ import annotations

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


def test_reprofiling_replaces_rows(profiled):
    conn, spec = profiled
    before = conn.execute("SELECT count(*) FROM op_profiles").fetchone()[0]
    profile_model(conn, spec, [2], runs=2, warmup=0, show_progress=False)
    rows = dict(conn.execute("SELECT batch_size, count(DISTINCT run) FROM op_profiles GROUP BY ALL").fetchall())
    assert rows == {2: 2, 4: 3}
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
