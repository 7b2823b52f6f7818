"""Artifacts under TAG_ARTIFACTS (tag_core.artifacts), on real fsspec file systems: a local folder and memory://."""

from __future__ import annotations

import hashlib
import shutil
import uuid
from pathlib import Path

import fsspec
import pytest

from tag_core import artifacts, store
from tag_core.errors import TagInputError


@pytest.fixture(params=["local", "memory"])
def root(request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = str(tmp_path / "root") if request.param == "local" else f"memory://tag-tests-{uuid.uuid4().hex}"
    monkeypatch.setenv("TAG_ARTIFACTS", url)
    return url


def objects(url: str) -> list[str]:
    fs, path = fsspec.core.url_to_fs(url)
    return [p for p in fs.find(path) if "/refs/" not in p] if fs.exists(path) else []


def new_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Path:
    """Another worker: an empty TAG_HOME, the same TAG_ARTIFACTS."""
    monkeypatch.setenv("TAG_HOME", str(tmp_path / name))
    return tmp_path / name


def test_round_trip_from_an_empty_home(root, tmp_path, monkeypatch):
    source = tmp_path / "weights.bin"
    source.write_bytes(b"\x00\x01" * 1000)
    address = artifacts.put_file(source)
    assert artifacts.is_address(address) and address.endswith("/weights.bin")
    home = new_home(tmp_path, monkeypatch, "elsewhere")
    copy = artifacts.fetch(address)
    assert copy.read_bytes() == source.read_bytes() and copy.is_relative_to(home / "cache" / "artifacts")
    assert artifacts.fetch(address) == copy  # cached
    assert artifacts.fetch(artifacts.put_bytes(b"hello", "note.txt")).read_bytes() == b"hello"


def test_same_bytes_same_address_one_object(root, tmp_path):
    first = artifacts.put_bytes(b"same", "a.txt")
    (tmp_path / "a.txt").write_bytes(b"same")
    assert artifacts.put_file(tmp_path / "a.txt") == first == artifacts.put_bytes(b"same", "a.txt")
    assert len(objects(root)) == 1
    digest = hashlib.sha256(b"same").hexdigest()
    assert first == f"sha256/{digest[:2]}/{digest}/a.txt"
    assert artifacts.put_bytes(b"other", "a.txt") != first


def test_folder_round_trip(root, tmp_path, monkeypatch):
    folder = tmp_path / "emitted"
    (folder / "sub").mkdir(parents=True)
    (folder / "graph.pb").write_bytes(b"graph")
    (folder / "sub" / "spec.json").write_text("{}")
    (folder / "sub" / "graph.pb").write_bytes(b"graph")  # same name and bytes: one object
    address = artifacts.put_folder(folder)
    assert artifacts.put_folder(folder) == address
    assert len(objects(root)) == 3  # two distinct files and the manifest
    new_home(tmp_path, monkeypatch, "elsewhere")
    copy = artifacts.fetch_folder(address)
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()) == [
        "graph.pb", "sub/graph.pb", "sub/spec.json"]
    assert (copy / "sub" / "graph.pb").read_bytes() == b"graph"


def test_a_crash_mid_write_leaves_nothing_at_the_address(tmp_path, monkeypatch):
    monkeypatch.setenv("TAG_ARTIFACTS", str(tmp_path / "root"))
    data = b"x" * (3 << 20)
    digest = hashlib.sha256(data).hexdigest()

    def crash(source, out):
        out.write(source.read(1 << 20))
        raise KeyboardInterrupt  # the worker dies mid-copy

    monkeypatch.setattr(artifacts, "_copy", crash)
    with pytest.raises(KeyboardInterrupt):
        artifacts.put_bytes(data, "big.bin")
    assert not artifacts.exists(f"sha256/{digest[:2]}/{digest}/big.bin")
    assert objects(str(tmp_path / "root")) == []  # no temporary left behind either


def test_a_folder_whose_upload_crashed_has_no_address(root, tmp_path, monkeypatch):
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("a", "b", "c"):
        (folder / name).write_text(name)
    address = artifacts.put_folder(folder)
    fs, base = fsspec.core.url_to_fs(root)
    fs.rm(base, recursive=True)  # start again from an empty root
    put_file, calls = artifacts.put_file, []

    def dies_on_the_second(path, name=None):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("connection reset")
        return put_file(path, name)

    monkeypatch.setattr(artifacts, "put_file", dies_on_the_second)
    with pytest.raises(OSError):
        artifacts.put_folder(folder)
    assert not artifacts.exists(address)  # the manifest, written last, is the folder's address


def test_a_missing_address_is_one_line_naming_it(root):
    address = f"sha256/ab/{'ab' * 32}/step_b4.json"
    with pytest.raises(TagInputError) as error:
        artifacts.fetch(address)
    assert str(error.value) == f"artifact: {address} is missing under TAG_ARTIFACTS={root}"
    with pytest.raises(TagInputError, match="missing"):
        artifacts.fetch_folder(address)


def test_a_corrupt_object_is_refused(root):
    address = artifacts.put_bytes(b"good", "f.bin")
    fs, base = fsspec.core.url_to_fs(root)
    fs.pipe_file(f"{base.rstrip('/')}/{address}", b"evil")
    with pytest.raises(TagInputError, match="does not match its hash"):
        artifacts.fetch(address)


def test_refs_point_at_the_latest(root):
    assert artifacts.get_ref("gnn/checkpoint") is None
    first, second = artifacts.put_bytes(b"1", "c.pt"), artifacts.put_bytes(b"2", "c.pt")
    artifacts.set_ref("gnn/checkpoint", first)
    artifacts.set_ref("gnn/checkpoint", second)
    assert artifacts.get_ref("gnn/checkpoint") == second
    with pytest.raises(ValueError):
        artifacts.set_ref("../escape", first)


def test_local_paths_from_an_older_store_still_read(tmp_path):
    old = tmp_path / "captures" / "step_b4.json"
    old.parent.mkdir()
    old.write_text("{}")
    assert artifacts.fetch(str(old)) == old and artifacts.fetch_folder(str(old.parent)) == old.parent
    with pytest.raises(TagInputError, match="does not exist"):
        artifacts.fetch(str(tmp_path / "gone.json"))


def test_the_default_root_is_under_tag_home(tag_home, monkeypatch):
    monkeypatch.delenv("TAG_ARTIFACTS")
    assert Path(artifacts.root()) == (tag_home / "artifacts").resolve()


def test_the_gnn_checkpoint_reaches_a_worker_with_an_empty_home(tmp_path, monkeypatch):
    from tag_core.gnn.prior import current_checkpoint, publish_checkpoint, trained_checkpoint

    monkeypatch.setenv("TAG_ARTIFACTS", str(tmp_path / "shared"))
    new_home(tmp_path, monkeypatch, "a")
    assert current_checkpoint() is None
    trained_checkpoint().parent.mkdir(parents=True)
    trained_checkpoint().write_bytes(b"weights")
    assert current_checkpoint() == trained_checkpoint()  # an older TAG's file, before any publishing
    publish_checkpoint(trained_checkpoint())
    new_home(tmp_path, monkeypatch, "b")
    assert current_checkpoint().read_bytes() == b"weights"


@pytest.mark.slow  # a capture and a profiling child: TF start-ups
def test_profiling_runs_on_a_worker_with_an_empty_home(tmp_path, monkeypatch):
    from tag_core.capture import capture_model, resolve_model, steps
    from tag_core.profile import profile_model

    monkeypatch.setenv("TAG_ARTIFACTS", str(tmp_path / "shared"))
    home_a = new_home(tmp_path, monkeypatch, "a")
    database = tmp_path / "shared.duckdb"
    spec = resolve_model("mlp[features=6,hidden=4]", batch_size=4)
    with store.connect(database) as conn:
        capture_model(conn, spec, batches=[2])
        assert artifacts.is_address(store.captured_model(conn, spec.name)["step_file"])
    shutil.rmtree(home_a)  # nothing of worker A's disk is left

    home_b = new_home(tmp_path, monkeypatch, "b")

    def no_tracing(*args, **kwargs):
        raise AssertionError("traced again: the published steps were not used")

    monkeypatch.setattr(steps, "capture_model", no_tracing)
    monkeypatch.setattr(steps, "trace_batches", no_tracing)
    monkeypatch.setattr(steps, "_run_child", no_tracing)
    with store.connect(database) as conn:
        rows = profile_model(conn, spec, [2, 4], runs=1, warmup=0, show_progress=False)
    assert sorted(rows.batch_size.unique()) == [2, 4]
    assert not (home_b / "captures").exists() and any((home_b / "cache" / "artifacts").rglob("*.json"))
