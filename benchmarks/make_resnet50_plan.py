"""Build the INT8 ResNet-50 v1.5 plan for the GPU benchmark here, on the CPU, as a file to carry there.

    python benchmarks/make_resnet50_plan.py [--batch 128] [--out .plans/resnet50_v15_int8_b128.plan] [--check]

Each step is timed: the Keras model (models/resnet50_v15.py, seeded random weights) is saved as a
SavedModel; TrtGraphConverterV2 converts it in INT8, calibrating on random normal batches
(``--calibrator``, default minmax); ``converter.build`` builds the engine for [batch, 224, 224, 3] (and
runs it once); the converted SavedModel is saved and its engine exported with tftrt_py.tools.export to
``--out`` (plus the export's .json sidecar naming the bindings). The model must convert into one engine.
The plan is about 102 MB: its int8 convolutions keep float32 weights (quantized per channel when built).

``--check`` loads the plan on the numpy backend and compares a batch of 2 images with TensorFlow running
the SavedModel: relative L2 error <= ``--tolerance`` (INT8 gives about 1.4e-2, most of it from the int8
classifier reading the pooled features). The engine is row-wise, so it serves the smaller batch, but it
pads it to the full batch: the check costs one full-batch CPU run.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
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
from tftrt_py.convert.params import CALIBRATION_ALGORITHMS  # noqa: E402
from tftrt_py.converters.summary import conversion_ratio, engine_op_counts  # noqa: E402
from tftrt_py.engine.runtime import deserialize  # noqa: E402
from tftrt_py.tools.export import export_plans  # noqa: E402

SIZE = 224


@contextlib.contextmanager
def step(name: str, times: dict):
    start = time.perf_counter()
    yield
    times[name] = time.perf_counter() - start
    print(f"[plan] {name}: {times[name]:.1f} s", flush=True)


def images(rng, batch: int) -> np.ndarray:
    return rng.standard_normal((batch, SIZE, SIZE, 3)).astype(np.float32)


def export_plan(converted_dir: str, out: str, batch: int) -> str:
    """Export the converted SavedModel's engine for `batch` to `out` (and its sidecar to out's .json)."""
    with tempfile.TemporaryDirectory() as tmp:
        found = []
        for path in export_plans(converted_dir, tmp):
            with open(path[:-len(".plan")] + ".json") as f:
                info = json.load(f)
            if info["inputs"][0]["shape"][0] == batch:
                found.append((path, info))
        if len(found) != 1:
            raise SystemExit(f"expected one engine for batch {batch}, the export holds {len(found)}")
        (path, info), = found
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        shutil.copyfile(path, out)
    with open(os.path.splitext(out)[0] + ".json", "w") as f:
        json.dump(dict(info, plan=os.path.basename(out)), f, indent=2)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128, help="the engine's batch (default 128)")
    parser.add_argument("--out", help="plan file (default .plans/resnet50_v15_int8_b<batch>.plan)")
    parser.add_argument("--seed", type=int, default=0, help="the model's weights")
    parser.add_argument("--calibrator", default="minmax", choices=CALIBRATION_ALGORITHMS)
    parser.add_argument("--calib-batches", type=int, default=2)
    parser.add_argument("--calib-batch-size", type=int, default=8, help="clamped to --batch")
    parser.add_argument("--check", action="store_true", help="compare the plan with TensorFlow on 2 images")
    parser.add_argument("--tolerance", type=float, default=2e-2, help="of --check's relative L2 error")
    args = parser.parse_args()
    out = args.out or os.path.join(ROOT, ".plans", f"resnet50_v15_int8_b{args.batch}.plan")
    rng = np.random.default_rng(args.seed)
    times = {}

    with tempfile.TemporaryDirectory(prefix="resnet50_plan_") as tmp:
        native_dir, converted_dir = os.path.join(tmp, "native"), os.path.join(tmp, "converted")
        with step("Keras model -> SavedModel", times):
            resnet50_v15.save(native_dir, args.seed)
        converter = trt.TrtGraphConverterV2(input_saved_model_dir=native_dir, precision_mode="INT8",
                                            use_calibration=True, calibration_algorithm=args.calibrator)
        # calibrating builds engines for the calibration batch, which would serve a smaller --batch
        calib_batch = min(args.calib_batch_size, args.batch)
        calib = [images(rng, calib_batch) for _ in range(args.calib_batches)]
        with step(f"convert + INT8 calibration ({args.calibrator}, {args.calib_batches} x {calib_batch})", times):
            converter.convert(calibration_input_fn=lambda: ((x,) for x in calib))
        converter.summary()
        engines = engine_op_counts(converter._converted_graph_def)
        if len(engines) != 1:
            raise SystemExit(f"expected one engine, the conversion made {len(engines)}: {sorted(engines)}")
        inside, total = conversion_ratio(converter._converted_graph_def)
        with step(f"build at batch {args.batch} (engine build + one run)", times):
            converter.build(input_fn=lambda: iter([(images(rng, args.batch),)]))
        with step("save converted SavedModel", times):
            converter.save(converted_dir)
        with step("export plan", times):
            export_plan(converted_dir, out, args.batch)
        with open(out, "rb") as f:
            data = f.read()
        with step("load plan (numpy backend)", times):
            engine = deserialize(data, backend="numpy")
        kinds = collections.Counter(layer.kind for layer in engine.network.layers)
        precisions = collections.Counter(layer.precision or "-" for layer in engine.network.layers)
        print(f"[plan] {out}: {len(data) / 1e6:.1f} MB, {engine.precision}, input "
              f"{list(engine.inputs[0].shape)}, row-wise {engine.rowwise}")
        print(f"[plan] one engine holding {inside}/{total} ops ({100.0 * inside / total:.2f}%); "
              f"{len(engine.network.layers)} layers: {dict(kinds)}; precisions {dict(precisions)}")

        if args.check:
            x = images(rng, 2)
            native = tf.saved_model.load(native_dir).signatures["serving_default"]
            (name, _), = native.structured_input_signature[1].items()
            want, = (v.numpy() for v in native(**{name: tf.constant(x)}).values())
            with step(f"check: numpy engine on 2 images (padded to {args.batch})", times):
                got, = engine.create_execution_context().execute_v2([x])
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            ok = err <= args.tolerance
            print(f"[plan] check: |plan - TF| / |TF| = {err:.2e} (tolerance {args.tolerance:.0e}), max |plan - TF| / "
                  f"max |TF| = {np.max(np.abs(got - want)) / np.max(np.abs(want)):.2e}, top-1 agrees "
                  f"{np.mean(got.argmax(1) == want.argmax(1)) * 100:.0f}%: {'OK' if ok else 'FAILED'}")
            if not ok:
                return 1
    print("[plan] times: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
