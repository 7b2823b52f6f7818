"""A user model with no defined inputs (a Sequential without keras.Input, a subclassed model never
called) is one line naming the file and function, exit 2, and nothing stored: not a keras traceback."""

from __future__ import annotations

import textwrap

import pytest

from tag_core.capture import resolve_model
from tag_core.cli import main
from tag_core.errors import TagInputError

MODELS = textwrap.dedent(
    """
    import keras

    def no_input():
        return keras.Sequential([keras.layers.Dense(4)])

    def empty():
        return keras.Sequential([])

    class Tower(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            return self.dense(x)

    def subclassed():
        return Tower()

    def with_input():
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(4)])
    """
)


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "user_models.py"
    path.write_text(MODELS)
    return path


@pytest.mark.parametrize("function", ["no_input", "empty", "subclassed"])
def test_model_without_inputs_is_one_line_and_exit_2(model_file, function, tag_home, capsys):
    reference = f"{model_file}:{function}"
    assert main(["capture", reference]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"tag: error: model: {reference}: model has no defined inputs; give it a keras.Input "
                            "(e.g. keras.Input((12,)) as the first layer of a Sequential)\n")
    assert not (tag_home / "tag.duckdb").exists()  # refused before the store opened


def test_the_same_model_with_an_input_resolves(model_file):
    spec = resolve_model(f"{model_file}:with_input")
    assert [i.shape for i in spec.inputs] == [(6,)] and spec.label.max_value == 4
    with pytest.raises(TagInputError, match="no_input: model has no defined inputs"):
        resolve_model(f"{model_file}:no_input")
