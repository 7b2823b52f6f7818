"""scikit-learn's bundled 8x8 digits (1,797 images of 0-9, shipped inside the package: nothing is downloaded),
as `tag train --data` takes it: functions returning a tf.data.Dataset of (inputs, labels).

80% of the rows, drawn with a fixed seed, train; the rest validate. `*_features` give each image as 64 floats in [0, 1] (for
`mlp[features=64]`), `*_images` as 8x8x3 (the grey level in every channel, for `small_cnn[image_size=8]`).

    tag train "mlp[features=64]" --strategy dp-nccl --topology T.json \\
        --data examples/data/digits.py:train_features --validation-data examples/data/digits.py:validation_features \\
        --epochs 5 --out runs/digits
"""

from __future__ import annotations

import numpy as np

TRAIN_SHARE = 0.8
SPLIT_SEED = 0


def arrays(part: str, images: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels) of "train" or "validation" as numpy arrays."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    cut = int(len(x) * TRAIN_SHARE)
    rows = order[:cut] if part == "train" else order[cut:]
    x, y = x[rows], y[rows]
    if images:
        x = np.repeat(x.reshape(-1, 8, 8, 1), 3, axis=-1)
    return x, y


def _dataset(part: str, images: bool):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(arrays(part, images))


def train_features():
    return _dataset("train", False)


def validation_features():
    return _dataset("validation", False)


def train_images():
    return _dataset("train", True)


def validation_images():
    return _dataset("validation", True)
