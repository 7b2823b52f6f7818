"""Model references: zoo names, options, user files, and the errors bad references get."""

from __future__ import annotations

import pytest

from tag_core.capture import BENCHMARK_MODELS, ZOO, model_source_hash, resolve_model
from tag_core.errors import TagInputError


def test_zoo_has_the_benchmark_and_test_models():
    assert set(BENCHMARK_MODELS) <= set(ZOO)
    assert {"vgg19", "resnet101", "inception_v3", "mobilenet_v2", "transformer", "bert_base", "mlp", "small_cnn"} == set(ZOO)


def test_options_and_batch_size_are_configurable():
    spec = resolve_model("mobilenet_v2[image_size=96, classes=10]", batch_size=8)
    assert spec.inputs[0].shape == (96, 96, 3)
    assert spec.label.max_value == 10
    assert spec.batch_size == 8
    assert spec.name == "mobilenet_v2[image_size=96, classes=10]"
    assert resolve_model("transformer").options["d_model"] == 512


@pytest.mark.parametrize(
    "reference, fragment",
    [
        ("no_such_model", "unknown model 'no_such_model'"),
        ("vgg19[depth=3]", "vgg19 has no option 'depth'"),
        ("vgg19[image_size=big]", "option image_size of vgg19 must be int"),
        ("vgg19[image_size=0]", "must be positive"),
        ("mlp[hidden=8,hidden=16]", "option hidden of mlp is given twice"),
        ("", "a model name"),
        ("missing_dir/model.py:build", "file 'missing_dir/model.py' does not exist"),
    ],
)
def test_bad_references_name_the_problem(reference, fragment):
    with pytest.raises(TagInputError) as error:
        resolve_model(reference)
    assert error.value.where == "model"
    assert fragment in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("batch_size", [0, -3])
def test_non_positive_batch_size_is_refused(batch_size):
    with pytest.raises(TagInputError, match="batch_size: must be a positive integer"):
        resolve_model("mlp", batch_size=batch_size)


def test_user_model_plain_keras(user_model_file):
    spec = resolve_model(f"{user_model_file}:plain")
    assert [i.shape for i in spec.inputs] == [(12,)]
    assert spec.label.max_value == 5 and spec.label.dtype == "int32"
    assert spec.loss == "sparse_categorical_crossentropy"
    assert spec.source_file == str(user_model_file.resolve())


def test_user_model_spec_keeps_its_settings(user_model_file):
    spec = resolve_model(f"{user_model_file}:with_spec")
    assert spec.batch_size == 4 and spec.name == f"{user_model_file}:with_spec"


@pytest.mark.parametrize(
    "function, fragment",
    [
        ("raises", "raised RuntimeError: no GPU budget today"),
        ("returns_text", "returned str; expected a ModelSpec or a keras.Model"),
        ("absent", "has no function 'absent'"),
        ("not_callable", "has no function 'not_callable'"),
        ("exits", "raised SystemExit"),
        ("two_outputs", "has 2 outputs; a plain keras.Model needs one"),  # a builder that exits must not end tag with status 0
    ],
)
def test_bad_user_builders(user_model_file, function, fragment):
    with pytest.raises(TagInputError, match=fragment):
        resolve_model(f"{user_model_file}:{function}")


def test_user_file_that_does_not_import(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    with pytest.raises(TagInputError, match="could not import"):
        resolve_model(f"{broken}:f")


def test_source_hash_follows_the_file(user_model_file):
    before = model_source_hash(resolve_model(f"{user_model_file}:plain"))
    user_model_file.write_text(user_model_file.read_text() + "\n# edited\n")
    after = model_source_hash(resolve_model(f"{user_model_file}:plain"))
    assert before != after


def test_model_lists_split_between_references_not_inside_options():
    from tag_core.capture import split_models

    assert split_models("mlp, transformer[layers=1,seq_len=8],small_cnn,") == [
        "mlp", "transformer[layers=1,seq_len=8]", "small_cnn"]
    assert split_models(" , ") == []
