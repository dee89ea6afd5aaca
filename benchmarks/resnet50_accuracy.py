"""ResNet-50 v1.5 accuracy in reduced precision: INT8 and FP8 (and FP32) converted models against native TensorFlow.

    python benchmarks/resnet50_accuracy.py [--precisions FP32 INT8 FP8] [--calibrators minmax entropy]
                                           [--images 8] [--batch 4] [--strict]

The Keras model (models/resnet50_v15.py: seeded random weights, random batch-norm statistics, 1000 logits) is
converted per precision and calibrator (2 random batches of 8), built and served through the converted SavedModel on
this machine's backend (``TFTRT_PY_BACKEND``: set ``numpy`` to get the reference that the GPU's INT8 and FP8 kernels
are tested against: it rounds to int8 and E4M3 as they do). ``--strict`` sets TFTRT_PY_STRICT_TYPES=1 (every
quantizable layer stays quantized; a GPU build otherwise keeps a layer in FP16 where that is faster). Printed per
case: the relative L2 error of the logits against TF's FP32 logits on fresh random images (the bound it is held to:
2e-2), the largest error relative to the largest logit, and how often the top-1 class agrees. Then, per reduced
precision, the error of the last layer alone (the 1000-way Dense quantized as the numpy backend does, on FP32
features, its input range the calibration features' largest |x|, as minmax calibrates): the part of the logits'
error no earlier layer adds.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from models import resnet50_v15  # noqa: E402
from tftrt_py import trt_convert as trt  # noqa: E402

SIZE = 224


def images(rng, batch: int) -> np.ndarray:
    return rng.standard_normal((batch, SIZE, SIZE, 3)).astype(np.float32)


def last_layer_alone(precision: str, calib, test) -> float:
    """Relative L2 error of the logits when only the final Dense layer runs in `precision` (INT8 or FP8)."""
    import keras

    from tftrt_py.engine.quantization import FORMATS, quantize, quantize_per_channel

    model = resnet50_v15.build()
    features = keras.Model(model.input, model.get_layer("avgpool").output)
    x_calib, x = (np.concatenate([features(b).numpy() for b in part]).astype(np.float64) for part in (calib, test))
    w, bias = (v.numpy().astype(np.float64) for v in model.get_layer("fc").weights)
    qx, sx = quantize(x, float(np.abs(x_calib).max()), FORMATS[precision])
    qw, sw = quantize_per_channel(w, -1, FORMATS[precision])
    want = x @ w + bias
    return float(np.linalg.norm((qx * sx) @ (qw * sw) + bias - want) / np.linalg.norm(want))


def serve(signature, batches):
    (name, _), = signature.structured_input_signature[1].items()
    return np.concatenate([next(iter(signature(**{name: tf.constant(x)}).values())).numpy() for x in batches])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precisions", nargs="+", default=["FP32", "INT8", "FP8"])
    parser.add_argument("--calibrators", nargs="+", default=["minmax", "entropy"])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--strict", action="store_true", help="strict_types: every quantizable layer quantized")
    parser.add_argument("--tolerance", type=float, default=2e-2)
    args = parser.parse_args()
    if args.strict:
        os.environ["TFTRT_PY_STRICT_TYPES"] = "1"
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="resnet50_accuracy_") as tmp:
        native_dir = resnet50_v15.save(os.path.join(tmp, "native"))
        native = tf.saved_model.load(native_dir).signatures["serving_default"]
        test = [images(rng, args.batch) for _ in range(-(-args.images // args.batch))]
        want = serve(native, test)
        calib = [images(rng, 8) for _ in range(2)]
        for precision in args.precisions:
            for calibrator in (args.calibrators if precision in ("INT8", "FP8") else ["-"]):
                t0 = time.perf_counter()
                params = trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(
                    precision_mode=precision, **({"calibration_algorithm": calibrator} if calibrator != "-" else {}))
                converter = trt.TrtGraphConverterV2(input_saved_model_dir=native_dir, conversion_params=params)
                if calibrator != "-":
                    converter.convert(calibration_input_fn=lambda: ((x,) for x in calib))
                else:
                    converter.convert()
                out = os.path.join(tmp, f"{precision}_{calibrator}")
                converter.build(input_fn=lambda: iter([(test[0],)]))
                converter.save(out)
                got = serve(tf.saved_model.load(out).signatures["serving_default"], test)
                err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                rows.append((precision, calibrator, err, float(np.max(np.abs(got - want)) / np.max(np.abs(want))),
                             float(np.mean(got.argmax(1) == want.argmax(1))), time.perf_counter() - t0))
                print(f"{precision} {calibrator}: rel L2 {err:.2e}", flush=True)
        alone = {p: last_layer_alone(p, calib, test) for p in args.precisions if p in ("INT8", "FP8")}
    backend = os.environ.get("TFTRT_PY_BACKEND", "default")
    print(f"\nResNet-50 v1.5, {args.images} random images, backend {backend}, strict_types {args.strict}:")
    print(f"{'precision':<9} {'calibrator':<10} {'rel L2':>8} {'max rel':>8} {'top-1 same':>10} {'s':>6}  "
          f"(bound {args.tolerance:.0e})")
    for precision, calibrator, err, mx, top1, secs in rows:
        print(f"{precision:<9} {calibrator:<10} {err:>8.2e} {mx:>8.2e} {100 * top1:>9.0f}% {secs:>6.0f}"
              f"  {'ok' if err <= args.tolerance else 'OVER'}")
    for precision, err in alone.items():
        print(f"the last layer alone in {precision} (minmax range, the rest FP32): rel L2 {err:.2e}")
    return 0 if all(r[2] <= args.tolerance for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
