"""Sample SavedModels built locally (random, seeded weights; nothing downloaded).

    python models/sample_models.py OUT_DIR [--model mlp|small_cnn|resnet50|mobilenet_v2|inception_v3|vgg16]
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

__all__ = ["build_mlp", "build_small_cnn", "build_keras_application", "MODELS", "save_model"]


class MLP(tf.Module):
    """Two dense layers with a dict output whose keys are deliberately unsorted."""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.w1 = tf.Variable(rng.normal(0, 0.3, (16, 32)).astype("float32"))
        self.b1 = tf.Variable(rng.normal(0, 0.1, (32,)).astype("float32"))
        self.w2 = tf.Variable(rng.normal(0, 0.3, (32, 10)).astype("float32"))
        self.b2 = tf.Variable(rng.normal(0, 0.1, (10,)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="features")])
    def serve(self, features):
        h = tf.nn.relu(tf.matmul(features, self.w1) + self.b1)
        logits = tf.matmul(h, self.w2) + self.b2
        return {"scores": tf.nn.softmax(logits), "logits": logits}


def build_mlp(seed: int = 0):
    module = MLP(seed)
    return module, {"serving_default": module.serve}


def build_small_cnn(seed: int = 0, size: int = 32):
    """Conv/BN/ReLU blocks, max pooling, global average pooling and a softmax classifier (Keras)."""
    import keras

    keras.utils.set_random_seed(seed)
    L = keras.layers
    inputs = keras.Input((size, size, 3), name="image")
    x = inputs
    for filters in (16, 32):
        x = L.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        x = L.BatchNormalization()(x)
        x = L.ReLU()(x)
        x = L.MaxPooling2D()(x)
    x = L.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = L.GlobalAveragePooling2D()(x)
    outputs = L.Dense(10, activation="softmax", name="probs")(x)
    model = keras.Model(inputs, outputs)
    _randomize_batch_norm(model, seed)
    return model, None


def _randomize_batch_norm(model, seed):
    """Give batch-norm layers non-trivial statistics so folding them is really tested."""
    rng = np.random.default_rng(seed)
    draws = {"gamma": lambda n: rng.uniform(0.5, 1.5, n), "beta": lambda n: rng.normal(0, 0.1, n),
             "moving_mean": lambda n: rng.normal(0, 0.1, n), "moving_variance": lambda n: rng.uniform(0.5, 1.5, n)}
    for layer in model.layers:
        if type(layer).__name__ == "BatchNormalization":
            for attr, draw in draws.items():
                var = getattr(layer, attr, None)
                if var is not None:
                    var.assign(draw(var.shape).astype("float32"))


KERAS_APPLICATIONS = {"resnet50": ("ResNet50", 96), "mobilenet_v2": ("MobileNetV2", 96),
                      "inception_v3": ("InceptionV3", 96), "vgg16": ("VGG16", 64)}


def build_keras_application(name: str, seed: int = 0, size: int = None):
    """A keras.applications model with weights=None (seeded), at a small input size."""
    import keras

    keras.utils.set_random_seed(seed)
    cls_name, default_size = KERAS_APPLICATIONS[name]
    size = size or default_size
    model = getattr(keras.applications, cls_name)(weights=None, input_shape=(size, size, 3))
    _randomize_batch_norm(model, seed)
    return model, None


MODELS = {"mlp": build_mlp, "small_cnn": build_small_cnn,
          **{k: (lambda k=k: build_keras_application(k)) for k in KERAS_APPLICATIONS}}


def save_model(name: str, out_dir: str) -> str:
    """Build sample model `name` and save it as a SavedModel in `out_dir`."""
    obj, signatures = MODELS[name]()
    if signatures is None:  # a Keras model: export gives a serving_default signature
        obj.export(out_dir, verbose=False)
    else:
        tf.saved_model.save(obj, out_dir, signatures=signatures)
    return out_dir


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--model", default="small_cnn", choices=sorted(MODELS))
    args = parser.parse_args()
    print(save_model(args.model, args.out_dir))


if __name__ == "__main__":
    main()
