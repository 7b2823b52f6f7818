"""`tag train` on TF's distributed runtime (local servers): real data in, checkpoints, resume under the same plan
and under a re-plan for a smaller topology, a dead worker, kill -9 mid-checkpoint, NaN, and model.keras out.

Every run is the real thing: the emitted step on pinned or in-process TF servers, fed scikit-learn's bundled
digits, checkpoints written and read by TF, the Keras model saved and loaded."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from child_processes import started_by

from tag_core.capture import resolve_model
from tag_core.cli import main
from tag_core.cluster import parse_topology
from tag_core.train import complete_checkpoints, latest_checkpoint, train

ROOT = Path(__file__).resolve().parents[1]
MODEL = "mlp[features=64,hidden=32]"
STEPS, PART = 40, 15
LOCAL2 = {"name": "local2", "inter_gbps": 7.8, "machines": [
    {"name": "task0", "gpu": "V100-32GB", "count": 1, "intra_gbps": 100},
    {"name": "task1", "gpu": "V100-32GB", "count": 1, "intra_gbps": 100}]}
LOCAL1 = {"name": "local1", "inter_gbps": 7.8, "machines": [LOCAL2["machines"][0]]}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def digits(path: Path, rows: slice = slice(None), nan_row: int | None = None) -> Path:
    sys.path.insert(0, str(ROOT / "examples" / "data"))
    try:
        import digits as bundled
    finally:
        sys.path.pop(0)
    x, y = bundled.arrays("train")
    x, y = x[rows].copy(), y[rows]
    if nan_row is not None:
        x[nan_row] = np.nan
    np.savez(path, features=x, labels=y)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("train")


@pytest.fixture(scope="module")
def data(folder):
    return str(digits(folder / "digits.npz"))


def trained(out, data, steps: int):
    result = train(resolve_model(MODEL), out, data, strategy="dp-nccl", topology=parse_topology(LOCAL2),
                   steps=steps, checkpoint_every=10)
    assert result.ok, "\n".join(result.lines + [result.error or ""])
    return result


@pytest.fixture(scope="module")
def uninterrupted(folder, data):
    return trained(folder / "full", data, STEPS)


@pytest.fixture(scope="module")
def first_part(folder, data):
    return trained(folder / "part", data, PART)


def relative(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b) / np.abs(a)))


def test_a_run_trains_checkpoints_and_logs(uninterrupted, data):
    import tensorflow as tf

    r = uninterrupted
    assert [s["step"] for s in r.events.steps] == list(range(1, STEPS + 1))
    assert np.mean(r.losses[-5:]) < np.mean(r.losses[:5])  # it learns
    assert r.events.start["dropped"] == 1437 % 32 and r.events.start["steps_per_epoch"] == 1437 // 32
    assert 0 <= r.events.done["input_share"] < 1 and r.events.done["samples_per_s"] > 0
    kept = complete_checkpoints(r.run_dir)
    assert [p.name for p in kept] == ["step-00000020", "step-00000030", "step-00000040"]  # the newest 3
    # A TF checkpoint keyed by the Keras variable paths, found through TF's own pointer file.
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(r.run_dir / "checkpoints")))
    names = {v.name for v in r.emission.reference.variables}
    assert set(reader.get_variable_to_shape_map()) == names
    assert "mlp/dense/kernel" in names and "adam/iteration" in names
    assert int(reader.get_tensor("adam/iteration")) == STEPS
    state = json.loads((kept[-1] / "state.json").read_text())
    assert state["step"] == STEPS and state["epoch"] == STEPS // 44 and state["batches_done_in_epoch"] == STEPS % 44
    # TensorBoard events: a loss and a samples/s scalar per step.
    from tensorflow.core.util import event_pb2

    tags: dict[str, list[int]] = {}
    for path in (r.run_dir / "logs").glob("events.out.tfevents.*"):
        for record in tf.data.TFRecordDataset(str(path)):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(event.step)
    assert tags["loss"] == list(range(1, STEPS + 1)) and len(tags["samples_per_second"]) == STEPS


def test_resume_under_the_same_plan_equals_the_uninterrupted_run(uninterrupted, first_part, folder, data):
    run_dir = folder / "resumed_same"
    shutil.copytree(first_part.run_dir, run_dir)
    resumed = train(resolve_model(MODEL), run_dir, data, strategy="dp-nccl", topology=parse_topology(LOCAL2),
                    steps=STEPS, checkpoint_every=10, resume=True)
    assert resumed.ok, resumed.error
    assert resumed.first_step == PART and resumed.events.start["first_step"] == PART
    assert [s["step"] for s in resumed.events.steps] == list(range(PART + 1, STEPS + 1))
    assert relative(uninterrupted.losses, first_part.losses + resumed.losses) <= 1e-5


def test_resume_under_a_replanned_smaller_topology(uninterrupted, first_part, folder, data, capsys):
    """A machine is lost: the planner re-plans for what is left and training goes on from the checkpoint."""
    run_dir = folder / "resumed_replanned"
    shutil.copytree(first_part.run_dir, run_dir)
    smaller = folder / "local1.json"
    smaller.write_text(json.dumps(LOCAL1))
    plan = folder / "plan_local1.json"
    assert main(["plan", MODEL, "--topology", str(smaller), "--batch-size", "32", "--budget-iterations", "5",
                 "--out", str(plan)]) == 0
    capsys.readouterr()
    assert main(["train", MODEL, "--plan", str(plan), "--data", data, "--out", str(run_dir), "--steps", str(STEPS),
                 "--checkpoint-every", "10", "--resume", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)["run"]
    assert record["topology"] == "local1" and record["first_step"] == PART and record["steps"] == STEPS
    assert record["plan_id"] and record["resumed_from"].endswith("step-00000015")
    state = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert state["plan_id"] == record["plan_id"] and state["step"] == STEPS
    resumed = [step for _, step in record["loss_curve"]]
    assert relative(uninterrupted.losses[PART:], resumed) <= 1e-5
    assert relative(uninterrupted.losses[-1], record["final_loss"]) <= 1e-5
    # The store has the run, and tag lineage goes from the trained model to its plan and snapshot.
    assert main(["lineage", "--trained", str(run_dir / "model.keras"), "--json"]) == 0
    lineage = json.loads(capsys.readouterr().out)
    assert lineage[0]["plan_id"] == record["plan_id"] and lineage[0]["snapshot_file"] == str(smaller)


def test_a_step_on_one_device_runs_without_servers_and_computes_the_same(folder, data):
    """A local step whose ops all lie on task 0's device runs in the trainer's own session (auto), and its losses
    are the pinned servers' to the bit."""
    runs = {}
    for servers in ("auto", "pinned"):
        runs[servers] = train(resolve_model(MODEL), folder / f"one_device_{servers}", data, strategy="single",
                              topology=parse_topology(LOCAL2), steps=PART, checkpoint_every=PART, servers=servers)
        assert runs[servers].ok, runs[servers].error
    assert (runs["auto"].servers, runs["pinned"].servers) == ("direct", "pinned")
    assert not any("pinned single-core TF server" in line for line in runs["auto"].lines)
    assert any("pinned single-core TF server" in line for line in runs["pinned"].lines)
    assert runs["auto"].losses == runs["pinned"].losses
    assert runs["auto"].events.model["relative_difference"] <= 1e-5


def test_model_keras_loads_and_predicts_as_the_emitted_graph(uninterrupted, data):
    """model.keras holds the trained values, and on a batch its loss equals the single-device step's forward pass
    from the checkpoint (the emitted graph computes that step, `tag run --check`)."""
    import keras
    import tensorflow as tf

    from tag_core.capture.steps import load_step

    r = uninterrupted
    assert r.events.model["relative_difference"] <= 1e-5  # the trainer's own check against the emitted graph
    from tag_core.capture.trace import build_keras

    model = keras.models.load_model(r.run_dir / "model.keras")
    reader = tf.train.load_checkpoint(str(latest_checkpoint(r.run_dir) / "variables"))
    built, _ = build_keras(resolve_model(MODEL))  # as captured: its paths are the checkpoint's keys
    assert len(model.variables) == len(built.variables)
    for loaded, named in zip(model.variables, built.variables):
        np.testing.assert_array_equal(loaded.numpy(), reader.get_tensor(named.path))
    with np.load(data) as stored:
        x, y = stored["features"][:32], stored["labels"][:32].astype("int32")
    predicted = model(x, training=True)
    keras_loss = float(np.mean(keras.losses.sparse_categorical_crossentropy(y, predicted)))
    step = load_step(r.run_dir / "graph" / "reference" / "step_b32.json")
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(step.graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(step.init_op, {f"tag_init/value_{i}:0": reader.get_tensor(v.name)
                                   for i, v in enumerate(step.variables)})
        emitted_loss = session.run(step.loss_tensor, dict(zip(step.input_tensors, [x, y])))
    assert abs(keras_loss - emitted_loss) <= 1e-5 * abs(emitted_loss)
    assert model.optimizer is not None and int(model.optimizer.iterations.numpy()) == STEPS


def _trainer_pid(parent: int) -> int | None:
    return next((pid for pid, _ in started_by("tag_core.train.trainer", parent)), None)


def test_kill_9_mid_checkpoint_leaves_the_last_complete_one(folder, data):
    """kill -9 of the client while a checkpoint is being written: only complete checkpoints are visible, each
    loads whole, and --resume goes on from the newest to the end."""
    import tensorflow as tf

    big = "mlp[features=64,hidden=1024,layers=3]"  # 27 MB a checkpoint: a write takes long enough to be caught
    run_dir = folder / "killed"
    command = [sys.executable, "-m", "tag_core.cli", "train", big, "--strategy", "single", "--topology",
               str(folder / "local1_kill.json"), "--data", data, "--out", str(run_dir), "--steps", "400",
               "--checkpoint-every", "1", "--keep", "2"]
    (folder / "local1_kill.json").write_text(json.dumps(LOCAL1))
    caught = False
    for attempt in range(5):
        tag = subprocess.Popen(command + (["--resume"] if complete_checkpoints(run_dir) else []),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and tag.poll() is None:
                partial = list((run_dir / "checkpoints").glob(".step-*")) if (run_dir / "checkpoints").is_dir() else []
                if partial and len(complete_checkpoints(run_dir)) >= 1:
                    trainer = _trainer_pid(tag.pid)
                    if trainer is not None:
                        os.kill(trainer, signal.SIGKILL)
                    os.killpg(tag.pid, signal.SIGKILL)
                    caught = any(p.exists() for p in partial)
                    break
                time.sleep(0.002)
        finally:
            if tag.poll() is None:
                os.killpg(tag.pid, signal.SIGKILL)
            tag.wait()
        if caught:
            break
    assert caught, "no kill landed while a checkpoint was being written"
    time.sleep(1.0)  # the pinned servers and any stray child end themselves once their parent is gone
    kept = complete_checkpoints(run_dir)
    assert kept
    for checkpoint in kept:
        state = json.loads((checkpoint / "state.json").read_text())
        reader = tf.train.load_checkpoint(str(checkpoint / "variables"))
        assert set(reader.get_variable_to_shape_map()) == {v["name"] for v in state["variables"]}
        assert int(reader.get_tensor("adam/iteration")) == state["step"]
    last = json.loads((kept[-1] / "state.json").read_text())["step"]
    resumed = train(resolve_model(big), run_dir, data, strategy="single", topology=parse_topology(LOCAL1),
                    steps=last + 3, checkpoint_every=1, keep=2, resume=True)
    assert resumed.ok, resumed.error
    assert resumed.first_step == last and [s["step"] for s in resumed.events.steps] == [last + 1, last + 2, last + 3]
    assert not list((run_dir / "checkpoints").glob(".step-*"))  # what the killed writer left is swept


def test_a_dead_worker_task_stops_the_client_naming_it(folder, data):
    run_dir = folder / "dead_worker"
    lines: list[str] = []

    def kill_task_1_after_a_checkpoint():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not complete_checkpoints(run_dir):
            time.sleep(0.05)
        started = next(line for line in lines if line.startswith("started 2 pinned"))
        pid = int(started.split("task 1 on core")[1].split("(process ")[1].split(")")[0])
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_task_1_after_a_checkpoint, daemon=True)
    killer.start()
    # A hang would run into the test's own timeout; the run must end by itself, naming the task.
    result = train(resolve_model(MODEL), run_dir, data, strategy="dp-nccl", topology=parse_topology(LOCAL2),
                   steps=100_000, checkpoint_every=5, step_timeout=20, echo=lines.append)
    killer.join(timeout=5)
    assert not result.ok
    assert "task 1" in result.error, result.error
    assert result.events.steps[-1]["step"] < 100_000
    kept = latest_checkpoint(run_dir)
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(kept / "variables"))
    assert int(reader.get_tensor("adam/iteration")) == json.loads((kept / "state.json").read_text())["step"]
    assert not (run_dir / "model.keras").exists()


def test_a_nan_loss_stops_the_run_naming_the_step_and_keeps_the_last_good_checkpoint(folder, capsys):
    poisoned = str(digits(folder / "poisoned.npz", slice(0, 320), nan_row=7))
    run_dir = folder / "nan"
    topology = folder / "local2_nan.json"
    topology.write_text(json.dumps(LOCAL2))
    assert main(["train", MODEL, "--strategy", "dp-nccl", "--topology", str(topology), "--data", poisoned,
                 "--out", str(run_dir), "--epochs", "2", "--checkpoint-every", "1"]) == 1
    out = capsys.readouterr()
    message = next(line for line in (out.out + out.err).splitlines() if "training stopped" in line)
    assert "the loss is nan" in message or "holds NaN or Inf" in message
    step = int(message.split("step ")[1].split(":")[0])
    kept = latest_checkpoint(run_dir)
    if step > 1:
        assert kept is not None and json.loads((kept / "state.json").read_text())["step"] == step - 1
        import tensorflow as tf

        reader = tf.train.load_checkpoint(str(kept / "variables"))
        assert all(np.isfinite(reader.get_tensor(n)).all() for n in reader.get_variable_to_shape_map())
    assert not (run_dir / "model.keras").exists()
