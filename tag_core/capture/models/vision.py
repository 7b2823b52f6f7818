"""Image classifiers: the keras.applications CNNs (weights=None) and a tiny CNN for tests."""

from __future__ import annotations

from .spec import InputSpec, ModelSpec


def _application(name: str, constructor: str, image_size: int, classes: int, batch_size: int) -> ModelSpec:
    def build():
        import keras

        return getattr(keras.applications, constructor)(
            weights=None, input_shape=(image_size, image_size, 3), classes=classes
        )

    return ModelSpec(
        name=name,
        build=build,
        inputs=[InputSpec("images", (image_size, image_size, 3))],
        label=InputSpec("labels", (), "int32", max_value=classes),
        batch_size=batch_size,
        options={"image_size": image_size, "classes": classes},
    )


def vgg19(image_size: int = 224, classes: int = 1000, batch_size: int = 32) -> ModelSpec:
    return _application("vgg19", "VGG19", image_size, classes, batch_size)


def resnet101(image_size: int = 224, classes: int = 1000, batch_size: int = 32) -> ModelSpec:
    return _application("resnet101", "ResNet101", image_size, classes, batch_size)


def inception_v3(image_size: int = 299, classes: int = 1000, batch_size: int = 32) -> ModelSpec:
    return _application("inception_v3", "InceptionV3", image_size, classes, batch_size)


def mobilenet_v2(image_size: int = 224, classes: int = 1000, batch_size: int = 32) -> ModelSpec:
    return _application("mobilenet_v2", "MobileNetV2", image_size, classes, batch_size)


def small_cnn(image_size: int = 32, classes: int = 10, batch_size: int = 16) -> ModelSpec:
    def build():
        import keras
        from keras import layers

        return keras.Sequential(
            [
                keras.Input((image_size, image_size, 3)),
                layers.Conv2D(16, 3, padding="same", activation="relu"),
                layers.MaxPooling2D(),
                layers.Conv2D(32, 3, padding="same", activation="relu"),
                layers.MaxPooling2D(),
                layers.Flatten(),
                layers.Dense(64, activation="relu"),
                layers.Dense(classes, activation="softmax"),
            ],
            name="small_cnn",
        )

    return ModelSpec(
        name="small_cnn",
        build=build,
        inputs=[InputSpec("images", (image_size, image_size, 3))],
        label=InputSpec("labels", (), "int32", max_value=classes),
        batch_size=batch_size,
        options={"image_size": image_size, "classes": classes},
    )


def mlp(features: int = 784, hidden: int = 256, layers: int = 2, classes: int = 10, batch_size: int = 32) -> ModelSpec:
    def build():
        import keras

        stack = [keras.Input((features,))]
        stack += [keras.layers.Dense(hidden, activation="relu") for _ in range(layers)]
        stack.append(keras.layers.Dense(classes, activation="softmax"))
        return keras.Sequential(stack, name="mlp")

    return ModelSpec(
        name="mlp",
        build=build,
        inputs=[InputSpec("features", (features,))],
        label=InputSpec("labels", (), "int32", max_value=classes),
        batch_size=batch_size,
        options={"features": features, "hidden": hidden, "layers": layers, "classes": classes},
    )
