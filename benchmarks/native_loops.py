"""The zoo's keras-hub RetinaNet with its NMS loops left to TensorFlow and compiled by XLA (compile_native_loops),
served through TensorFlow, against native TF, in one process.

    python benchmarks/native_loops.py [--precision FP16] [--batches 1,8] [--rounds 3]

Engines run where the host's default backend runs them (cupy on an NVIDIA GPU, else ONNX Runtime); the loops run
on the CPU either way. Both converted models are built for the largest batch, saved and loaded; every batch's
labels and detection counts are compared with native TF's. Per round and batch: signature medians (outputs read with
``.numpy()``), ms.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), HERE]

import numpy as np  # noqa: E402

from served_gpu import timed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", default="FP32", type=str.upper)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]

    import keras
    import tensorflow as tf

    from tftrt_py import trt_convert as trt
    from zoo import models as zoo

    work = tempfile.mkdtemp(prefix="native_loops_")
    keras.utils.set_random_seed(0)
    native_dir = os.path.join(work, "native")
    zoo._export_detector(zoo._retinanet(), native_dir)
    images = tf.constant(np.random.default_rng(0).standard_normal((max(batches),) + zoo.RETINANET_IMAGE)
                         .astype("float32"))
    served = {"native TF": tf.saved_model.load(native_dir).signatures["serving_default"]}
    for compiled in (False, True):
        converter = trt.TrtGraphConverterV2(input_saved_model_dir=native_dir, precision_mode=args.precision,
                                            compile_native_loops=compiled)
        converter.convert()
        converter.build(input_fn=lambda: [images])
        out = os.path.join(work, f"loops_compiled_{compiled}")
        converter.save(out)
        name = "engines, loops compiled by XLA" if compiled else "engines, loops in TensorFlow"
        served[name] = tf.saved_model.load(out).signatures["serving_default"]
    for batch in batches:
        want = served["native TF"](images=images[:batch])
        for name, signature in served.items():
            got = signature(images=images[:batch])
            for key in ("labels", "num_detections"):
                if not np.array_equal(got[key].numpy(), want[key].numpy()):
                    print(f"batch {batch}, {name}: {key} differ from native TF's")
    print(f"{'round':>5} {'batch':>5} " + " ".join(f"{name:>32}" for name in served))
    for r in range(args.rounds):
        for batch in batches:
            x = images[:batch]
            times = [timed(lambda s=s: [v.numpy() for v in s(images=x).values()]) for s in served.values()]
            print(f"{r:>5} {batch:>5} " + " ".join(f"{t:>32.2f}" for t in times))


if __name__ == "__main__":
    main()
