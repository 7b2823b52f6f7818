"""Shared fixtures: every test gets its own TAG_HOME (and so its own DuckDB)."""

from __future__ import annotations

import os
import textwrap

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture
def tag_home(tmp_path, monkeypatch):
    home = tmp_path / "tag_home"
    monkeypatch.setenv("TAG_HOME", str(home))
    return home


@pytest.fixture
def user_model_file(tmp_path):
    """A user model file with several builders: a plain keras.Model, a ModelSpec, and broken ones."""
    path = tmp_path / "my_models.py"
    path.write_text(
        textwrap.dedent(
            '''
            import keras
            from tag_core.models import InputSpec, ModelSpec

            def plain():
                inputs = keras.Input((12,))
                hidden = keras.layers.Dense(8, activation="relu")(inputs)
                outputs = keras.layers.Dense(5, activation="softmax")(hidden)
                return keras.Model(inputs, outputs)

            def with_spec():
                def build():
                    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
                return ModelSpec(
                    name="ignored", build=build, inputs=[InputSpec("x", (6,))],
                    label=InputSpec("y", (), "int32", max_value=3),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), batch_size=4,
                )

            def raises():
                raise RuntimeError("no GPU budget today")

            def returns_text():
                return "not a model"

            def two_outputs():
                inputs = keras.Input((4,))
                return keras.Model(inputs, [keras.layers.Dense(2)(inputs), keras.layers.Dense(3)(inputs)])

            def exits():
                import sys
                sys.exit(0)

            not_callable = 3
            '''
        )
    )
    return path
