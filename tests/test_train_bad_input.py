"""`tag train` with bad input: exit 2, one line naming the argument and what is wrong, and nothing written
(the run folder is not made, or an existing one is left as it was). Everything is checked before any server
starts: the data against the captured inputs, the run folder, and a checkpoint against this model and data."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from tag_core.cli import main

MODEL = "mlp[features=64,hidden=16]"
TOPOLOGY = {"name": "local1", "inter_gbps": 7.8,
            "machines": [{"name": "task0", "gpu": "V100-32GB", "count": 1, "intra_gbps": 100}]}
ROWS = 96


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad_train")
    rng = np.random.default_rng(0)
    x, y = rng.random((ROWS, 64), dtype=np.float32), rng.integers(0, 10, ROWS)
    np.savez(folder / "good.npz", features=x, labels=y)
    np.savez(folder / "other.npz", features=x[::-1].copy(), labels=y)
    np.savez(folder / "no_labels.npz", features=x)
    np.savez(folder / "no_inputs.npz", pixels=x, labels=y)
    np.savez(folder / "shape.npz", features=x.reshape(ROWS, 8, 8), labels=y)
    np.savez(folder / "uint8.npz", features=(x * 255).astype(np.uint8), labels=y)
    np.savez(folder / "float_labels.npz", features=x, labels=y.astype(np.float32))
    np.savez(folder / "label_range.npz", features=x, labels=y + 5)
    np.savez(folder / "few.npz", features=x[:20], labels=y[:20])
    np.savez(folder / "ragged.npz", features=x, labels=y[:50])
    (folder / "broken.npz").write_bytes(b"PK\x03\x04 not really")
    (folder / "data.py").write_text(textwrap.dedent("""
        import time
        import numpy as np
        import tensorflow as tf

        X = np.zeros((96, 64), np.float32)
        Y = np.zeros(96, np.int32)

        def good():
            return tf.data.Dataset.from_tensor_slices((X, Y))

        def raises():
            raise RuntimeError("the bucket is gone")

        def hangs():
            time.sleep(3600)

        def not_a_dataset():
            return (X, Y)

        def inputs_only():
            return tf.data.Dataset.from_tensor_slices(X)

        def wrong_shape():
            return tf.data.Dataset.from_tensor_slices((np.zeros((96, 63), np.float32), Y))

        def wrong_dtype():
            return tf.data.Dataset.from_tensor_slices((X.astype(np.uint8), Y))

        def three_inputs():
            return tf.data.Dataset.from_tensor_slices(((X, X, X), Y))
    """))
    topology = folder / "local1.json"
    topology.write_text(json.dumps(TOPOLOGY))
    two = {**TOPOLOGY, "name": "local2", "machines": [TOPOLOGY["machines"][0], {**TOPOLOGY["machines"][0], "name": "task1"}]}
    (folder / "local2.json").write_text(json.dumps(two))
    return folder


def _train(folder, tmp_path, *extra, data="good.npz", out=None):
    data = data if ".py:" in data or "/" in data else str(folder / data)
    return ["train", MODEL, "--strategy", "single", "--topology", str(folder / "local1.json"), "--data", data,
            "--out", str(out or tmp_path / "run"), "--steps", "2", *extra]


def _refused(capsys, argv, *needles, where="--data"):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"tag: error: {where}"), err
    for needle in needles:
        assert needle in err, err
    return err


CASES = {
    "missing file": ("nothing.npz", ["does not exist"]),
    "neither npz nor function": ("data.csv", ["neither an .npz file nor path/to/file.py:function"]),
    "broken npz": ("broken.npz", ["not a readable .npz file"]),
    "labels missing": ("no_labels.npz", ["no array 'labels' (the labels)", "holds 'features'"]),
    "npz without the input's array": ("no_inputs.npz", ["no array 'features'", "holds 'pixels', 'labels'"]),
    "wrong shape": ("shape.npz", ["array 'features'", "has shape (96, 8, 8)", "the model takes (rows, 64)"]),
    "wrong dtype": ("uint8.npz", ["array 'features'", "dtype uint8", "float32"]),
    "float labels": ("float_labels.npz", ["array 'labels'", "dtype float32", "integers"]),
    "labels out of range": ("label_range.npz", ["array 'labels'", "[0, 10)"]),
    "fewer rows than a batch": ("few.npz", ["20 rows, fewer than one global batch of 32"]),
    "arrays of different lengths": ("ragged.npz", ["different numbers of rows", "features 96, labels 50"]),
    "function file missing": ("nowhere.py:good", ["does not exist"]),
    "function missing": ("data.py:absent", ["has no function 'absent'"]),
    "function raises": ("data.py:raises", ["raised RuntimeError: the bucket is gone"]),
    "function returns no dataset": ("data.py:not_a_dataset", ["returned tuple; expected a tf.data.Dataset"]),
    "dataset without labels": ("data.py:inputs_only", ["(inputs, labels) pairs"]),
    "dataset of the wrong shape": ("data.py:wrong_shape", ["input 'features'", "(63,)", "(64,)"]),
    "dataset of the wrong dtype": ("data.py:wrong_dtype", ["input 'features'", "dtype uint8"]),
    "dataset with too many inputs": ("data.py:three_inputs", ["3 tensors; the model takes 1"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_data_is_refused_before_anything_is_written(inputs, tmp_path, capsys, case):
    data, needles = CASES[case]
    if data.startswith("data.py"):
        data = str(inputs / data)
    elif data.startswith("nowhere.py"):
        data = str(tmp_path / data)
    _refused(capsys, _train(inputs, tmp_path, data=data), *needles)
    assert not (tmp_path / "run").exists()


def test_a_hanging_data_function_stops_at_the_model_timeout(inputs, tmp_path, capsys):
    _refused(capsys, _train(inputs, tmp_path, "--model-timeout", "2", data=str(inputs / "data.py:hangs")),
             "hangs() of", "did not finish within the model timeout of 2 s")
    assert not (tmp_path / "run").exists()


def test_bad_validation_data_names_its_argument(inputs, tmp_path, capsys):
    _refused(capsys, _train(inputs, tmp_path, "--validation-data", str(inputs / "shape.npz")),
             "array 'features'", where="--validation-data")
    assert not (tmp_path / "run").exists()


def test_run_folder_and_argument_mistakes(inputs, tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    _refused(capsys, _train(inputs, tmp_path, out=taken), "holds a run; pass --resume", where="--out")
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]
    _refused(capsys, _train(inputs, tmp_path, "--resume", out=taken), "no complete checkpoint", where="--resume")
    file = tmp_path / "file"
    file.write_text("x")
    _refused(capsys, _train(inputs, tmp_path, out=file), "is a file; give a folder", where="--out")
    with pytest.raises(SystemExit) as stopped:  # argparse's own one-line error
        main(_train(inputs, tmp_path, "--epochs", "2"))
    assert stopped.value.code == 2 and "not allowed with argument --steps" in capsys.readouterr().err
    _refused(capsys, ["train", MODEL, "--strategy", "single", "--data", str(inputs / "good.npz"), "--out",
                      str(tmp_path / "run")], "is required with --strategy", where="--topology")
    spread = [a if a != str(inputs / "local1.json") else str(inputs / "local2.json")
              for a in _train(inputs, tmp_path, "--servers", "direct")]
    spread[spread.index("single")] = "dp-nccl"  # replicas on both tasks: no one session holds them
    _refused(capsys, spread, "direct: the step's ops lie on more than one device", where="--servers")
    with pytest.raises(SystemExit) as stopped:
        main(_train(inputs, tmp_path, "--checkpoint-every", "0"))
    assert stopped.value.code == 2 and "--checkpoint-every: must be a positive integer" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_checkpoint_of_another_model_batch_or_data_is_refused(inputs, tmp_path, capsys):
    run = tmp_path / "trained"
    assert main(_train(inputs, tmp_path, out=run)) == 0
    capsys.readouterr()
    before = sorted((p.relative_to(run), p.stat().st_mtime_ns) for p in run.rglob("*"))
    other_model = _train(inputs, tmp_path, "--resume", out=run)
    other_model[1] = "mlp[features=64,hidden=8]"
    _refused(capsys, other_model, "of another model", "'mlp[features=64,hidden=16]'", where="--resume")
    _refused(capsys, _train(inputs, tmp_path, "--resume", "--batch-size", "16", out=run), "another global batch",
             "32", "16", where="--resume")
    _refused(capsys, _train(inputs, tmp_path, "--resume", data="other.npz", out=run), "another training data",
             where="--resume")
    assert sorted((p.relative_to(run), p.stat().st_mtime_ns) for p in run.rglob("*")) == before
