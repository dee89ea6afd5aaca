"""A small CNN trained here on scikit-learn's digits (8x8 images, up-sampled to 32x32 so pooling has work),
saved as a SavedModel whose ``serving_default`` maps ``image`` [N, 32, 32, 1] to class probabilities.

    python models/digits_cnn.py OUT_DIR [--epochs 10] [--seed 0] [--evaluate]

Training takes a few seconds on a CPU and is seeded. :func:`load_split` gives the same train / held-out
split to evaluate a converted model on and to calibrate INT8 with (training images only). ``--evaluate``
converts the model in FP32, FP16, INT8 (each calibrator) and FP8 (minmax ranges: E4M3's range covers the
outliers that entropy clipping is for) and prints held-out accuracy and calibration time as a Markdown table
(:func:`evaluate`).
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

__all__ = ["load_split", "build_model", "train", "save", "accuracy", "evaluate", "format_table", "SIZE",
           "CALIBRATORS"]

SIZE = 32  # the digits' 8x8 pixels, each repeated 4x4
CALIBRATORS = ("entropy", "minmax", "percentile")


def load_split(seed: int = 0, test_size: float = 0.2):
    """(x_train, y_train, x_test, y_test): images float32 [N, 32, 32, 1] in [0, 1], labels int64; a
    stratified split of the 1797 digits (the held-out part has 360)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)
    scale = SIZE // images.shape[1]
    images = images.repeat(scale, axis=1).repeat(scale, axis=2)[..., None]
    x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=test_size,
                                                        stratify=digits.target, random_state=seed)
    return x_train, y_train, x_test, y_test


def build_model(seed: int = 0):
    """Three Conv(3x3, ReLU) + MaxPool blocks, Flatten, Dense(64, ReLU), Dense(10), Softmax (Keras)."""
    import keras

    keras.utils.set_random_seed(seed)
    L = keras.layers
    inputs = keras.Input((SIZE, SIZE, 1), name="image")
    x = inputs
    for filters in (16, 32, 32):
        x = L.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = L.MaxPooling2D()(x)
    x = L.Flatten()(x)
    x = L.Dense(64, activation="relu")(x)
    x = L.Dense(10)(x)
    outputs = L.Softmax(name="probs")(x)
    return keras.Model(inputs, outputs)


def accuracy(probabilities, labels) -> float:
    """Top-1 accuracy in percent."""
    return float(np.mean(np.argmax(np.asarray(probabilities), axis=-1) == labels) * 100.0)


def train(seed: int = 0, epochs: int = 10):
    """(trained Keras model, held-out accuracy in percent)."""
    x_train, y_train, x_test, y_test = load_split(seed)
    model = build_model(seed)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_train, y_train, batch_size=32, epochs=epochs, shuffle=True, verbose=0)
    return model, accuracy(model.predict(x_test, batch_size=360, verbose=0), y_test)


def save(out_dir: str, seed: int = 0, epochs: int = 10) -> float:
    """Train and export the SavedModel to `out_dir`; returns the held-out accuracy in percent."""
    model, acc = train(seed, epochs)
    model.export(out_dir, verbose=False)
    return acc


def evaluate(saved_dir: str, seed: int = 0, calibration_batches: int = 10, batch_size: int = 32):
    """Held-out accuracy of the SavedModel run by TensorFlow and converted in FP32, FP16, INT8 with each
    calibrator and FP8 with minmax (over `calibration_batches` batches of training images). One dict per row:
    precision, calibrator, accuracy (percent), calibration_s (seconds of calibration, tables and engines
    included)."""
    import tensorflow as tf

    from tftrt_py import trt_convert as trt

    x_train, _, x_test, y_test = load_split(seed)
    batches = [x_train[i * batch_size:(i + 1) * batch_size] for i in range(calibration_batches)]
    native = tf.saved_model.load(saved_dir).signatures["serving_default"]
    rows = [{"precision": "TensorFlow", "calibrator": None, "calibration_s": None,
             "accuracy": accuracy(native(image=tf.constant(x_test))["output_0"], y_test)}]
    runs = [("FP32", None), ("FP16", None)] + [("INT8", c) for c in CALIBRATORS] + [("FP8", "minmax")]
    for precision, calibrator in runs:
        params = trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(precision_mode=precision,
                                                            calibration_algorithm=calibrator or "entropy")
        converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_dir, conversion_params=params)
        func = converter.convert(calibration_input_fn=(lambda: ((x,) for x in batches)) if calibrator else None)
        rows.append({"precision": precision, "calibrator": calibrator, "calibration_s": converter._calibration_seconds,
                     "accuracy": accuracy(func(image=tf.constant(x_test))["output_0"], y_test)})
    return rows


def format_table(rows, model: str = "digits CNN") -> str:
    """The rows of :func:`evaluate` as a Markdown table."""
    lines = ["| Model | Precision | Calibrator | Held-out accuracy | Calibration time |", "|---|---|---|---|---|"]
    for r in rows:
        seconds = "—" if r["calibration_s"] is None else f"{r['calibration_s']:.1f} s"
        lines.append(f"| {model} | {r['precision']} | {r['calibrator'] or '—'} | {r['accuracy']:.2f}% | {seconds} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--evaluate", action="store_true", help="convert in FP32, FP16 and INT8 and print accuracy")
    args = parser.parse_args()
    acc = save(args.out_dir, args.seed, args.epochs)
    print(f"{args.out_dir}: held-out accuracy {acc:.2f}%")
    if args.evaluate:
        print(format_table(evaluate(args.out_dir, args.seed)))


if __name__ == "__main__":
    main()
