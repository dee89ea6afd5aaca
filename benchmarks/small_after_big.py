"""Small requests after a big one: what a batch-1 call costs once a batch-512 engine holds the only cache slot.

    python benchmarks/small_after_big.py signature [--backend onnxruntime] [--big 512]   # TF on the CPU
    python benchmarks/small_after_big.py engine [--backend cupy] [--big 512]             # engines alone (GPU)

``signature``: Keras ResNet50 (random weights, 224x224) converted FP32 with TF-TRT's default
maximum_cached_engines=1 and engines built for batch 1, called through ``tf.saved_model.load`` as users do:
batch-1 latency, then one batch-512 call (its engine replaces batch 1's), then batch-1 latency again once the
smaller-batch copy is built (engine_op.buckets). ``engine``: the Network-API ResNet-50 of the GPU tests in FP16,
without TensorFlow: a batch-1 engine's latency, then a batch-512 engine serving batch 1 padded and through its copy.
Prints each latency (median of --calls) and the ratio to the batch-1 latency before the big request.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)


def median_ms(call, calls: int) -> float:
    call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def report(rows) -> None:
    base = rows[0][1]
    for name, ms in rows:
        print(f"{name:<44} {ms:9.3f} ms  {ms / base:6.2f}x")


def signature(args) -> None:
    os.environ["TFTRT_PY_BACKEND"] = args.backend
    import tensorflow as tf

    sys.path.insert(0, os.path.join(ROOT, "models"))
    import resnet50_v15
    from tftrt_py import trt_convert as trt
    from tftrt_py.engine_op import dispatcher

    tmp = tempfile.mkdtemp()
    resnet50_v15.save(os.path.join(tmp, "native"), size=args.size)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=os.path.join(tmp, "native"))
    converter.convert()
    image = np.random.default_rng(0).standard_normal((args.big, args.size, args.size, 3)).astype(np.float32)
    converter.build(lambda: [(image[:1],)])
    converter.save(os.path.join(tmp, "trt"))
    del converter
    model = tf.saved_model.load(os.path.join(tmp, "trt")).signatures["serving_default"]
    one, big = tf.constant(image[:1]), tf.constant(image)
    rows = [("batch 1 on its own engine", median_ms(lambda: model(image=one), args.calls))]
    start = time.perf_counter()
    model(image=big)
    print(f"batch {args.big} call (builds its engine): {time.perf_counter() - start:.1f} s")
    (op,) = dispatcher.engine_ops().values()
    first = time.perf_counter()
    model(image=one)
    rows.append(("first batch 1 after it (CPU: builds its copy)", (time.perf_counter() - first) * 1e3))
    for entry in list(op._contexts.values()):
        entry.wait()
    rows.append((f"batch 1 after batch {args.big} (its copy)", median_ms(lambda: model(image=one), args.calls)))
    print(f"engines cached: {len(op.cache)}, batch copies: {op.batch_copies}, backend {args.backend}")
    report(rows)


def engine(args) -> None:
    sys.path.insert(0, os.path.join(ROOT, "tests", "engine", "gpu"))
    import gpu_resnet50
    from tftrt_py.engine import Builder, BuilderConfig
    from tftrt_py.engine_op.buckets import serving_pool

    spec = gpu_resnet50.spec()
    config = BuilderConfig(precision=args.precision, backend=args.backend)

    def build(batch):
        return Builder(config).build_engine(gpu_resnet50.network(batch, args.size, spec))

    image = np.random.default_rng(0).standard_normal((args.big, args.size, args.size, 3)).astype(np.float32)
    small = serving_pool(build(1))
    rows = [("batch 1 on its own engine", median_ms(lambda: small.execute_v2([image[:1]]), args.calls))]
    start = time.perf_counter()
    big = serving_pool(build(args.big))
    print(f"batch {args.big} engine built in {time.perf_counter() - start:.1f} s")
    big.execute_v2([image])
    rows.append((f"batch 1 padded to batch {args.big}", median_ms(
        lambda: big.context_for([(args.big,) + image.shape[1:]]).execute_v2([image[:1]]), args.calls)))
    big.context_for([(1,) + image.shape[1:]])
    start = time.perf_counter()
    big.wait()
    print(f"batch-1 copy built in {time.perf_counter() - start:.1f} s")
    rows.append((f"batch 1 after batch {args.big} (its copy)", median_ms(lambda: big.execute_v2([image[:1]]),
                                                                         args.calls)))
    print(f"backend {args.backend}, {args.precision}, {args.size}x{args.size}")
    report(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", choices=("signature", "engine"))
    parser.add_argument("--backend", default=None, help="onnxruntime or numpy (signature), cupy (engine)")
    parser.add_argument("--big", type=int, default=512)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--precision", default="FP16", help="engine path only")
    args = parser.parse_args()
    args.backend = args.backend or ("onnxruntime" if args.path == "signature" else "cupy")
    (signature if args.path == "signature" else engine)(args)


if __name__ == "__main__":
    main()
