"""Keras ResNet-50 v1.5 in torchvision's layout (random, seeded weights; nothing downloaded), saved as a
SavedModel whose ``serving_default`` maps ``image`` [N, 224, 224, 3] (NHWC, float32) to 1000 logits.

    python models/resnet50_v15.py OUT_DIR [--seed 0] [--size 224]

v1.5: a stage's stride 2 sits on the 3x3 convolution and the 1x1 projection shortcut. Batch norms get
random statistics (gamma in [0.7, 1]; the last one of each residual branch in [0.1, 0.3], so activations
stay O(1) through the 16 residual sums); convolutions are He-initialised, as torchvision's.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from sample_models import _randomize_batch_norm  # noqa: E402

__all__ = ["build", "save", "STAGES"]

STAGES = ((3, 64), (4, 128), (6, 256), (3, 512))  # (blocks, width); expansion 4


def build(seed: int = 0, size: int = 224, classes: int = 1000):
    """The keras.Model: image [N, size, size, 3] -> logits [N, classes]."""
    import keras

    keras.utils.set_random_seed(seed)
    L = keras.layers
    last_bns = []

    def conv_bn(x, filters, k, stride, name, relu=True, last=False):
        if stride > 1 and k > 1:
            x = L.ZeroPadding2D(k // 2, name=f"{name}_pad")(x)
        x = L.Conv2D(filters, k, strides=stride, padding="same" if stride == 1 else "valid", use_bias=False,
                     kernel_initializer="he_normal", name=f"{name}_conv")(x)
        bn = L.BatchNormalization(epsilon=1e-5, name=f"{name}_bn")
        if last:
            last_bns.append(bn)
        x = bn(x)
        return L.ReLU(name=f"{name}_relu")(x) if relu else x

    inputs = keras.Input((size, size, 3), name="image")
    x = conv_bn(inputs, 64, 7, 2, "conv1")
    x = L.ZeroPadding2D(1, name="maxpool_pad")(x)
    x = L.MaxPooling2D(3, 2, name="maxpool")(x)
    for s, (blocks, width) in enumerate(STAGES):
        for b in range(blocks):
            name, stride = f"layer{s + 1}_{b}", 2 if (b == 0 and s > 0) else 1
            shortcut = conv_bn(x, width * 4, 1, stride, f"{name}_downsample", relu=False) if b == 0 else x
            y = conv_bn(x, width, 1, 1, f"{name}_conv1")
            y = conv_bn(y, width, 3, stride, f"{name}_conv2")
            y = conv_bn(y, width * 4, 1, 1, f"{name}_conv3", relu=False, last=True)
            x = L.ReLU(name=f"{name}_relu")(L.Add(name=f"{name}_add")([y, shortcut]))
    x = L.GlobalAveragePooling2D(name="avgpool")(x)
    outputs = L.Dense(classes, bias_initializer=keras.initializers.RandomNormal(stddev=0.01), name="fc")(x)
    model = keras.Model(inputs, outputs, name="resnet50_v15")
    _randomize_batch_norm(model, seed)
    rng = np.random.default_rng(seed + 1)
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            low, high = (0.1, 0.3) if layer in last_bns else (0.7, 1.0)
            layer.gamma.assign(rng.uniform(low, high, layer.gamma.shape).astype("float32"))
    return model


def save(path: str, seed: int = 0, size: int = 224) -> str:
    """Build the model and export it as a SavedModel to `path`; returns `path`."""
    build(seed, size).export(path, verbose=False)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=int, default=224)
    args = parser.parse_args()
    print(save(args.out_dir, args.seed, args.size))


if __name__ == "__main__":
    main()
