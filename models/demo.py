"""`make demo`: build a sample SavedModel, convert it, save, reload, check against native TF, time both.

    python models/demo.py [--model small_cnn|resnet50|...] [--batch 8] [--out out/demo]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from sample_models import MODELS, save_model  # noqa: E402
from tftrt_py import trt_convert as trt  # noqa: E402
from tftrt_py.engine_op import dispatcher  # noqa: E402


def _latency_ms(fn, feed, runs):
    fn(**feed)  # warm-up (and, for the converted model, engine look-up)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn(**feed)
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small_cnn", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", default=os.path.join("out", "demo"))
    args = parser.parse_args()

    native_dir = save_model(args.model, os.path.join(args.out, f"{args.model}_native"))
    converted_dir = os.path.join(args.out, f"{args.model}_converted")
    print(f"[demo] sample model {args.model!r} saved to {native_dir}")

    native = tf.saved_model.load(native_dir).signatures["serving_default"]
    (name, spec), = native.structured_input_signature[1].items()
    rng = np.random.default_rng(0)
    shape = [args.batch] + spec.shape.as_list()[1:]

    converter = trt.TrtGraphConverterV2(input_saved_model_dir=native_dir)
    start = time.perf_counter()
    converter.convert()
    convert_s = time.perf_counter() - start
    converter.summary()
    start = time.perf_counter()
    converter.build(input_fn=lambda: iter([{name: rng.standard_normal(shape).astype("float32")}]))
    build_s = time.perf_counter() - start
    converter.save(converted_dir, overwrite=True)  # the demo's own output directory, rewritten each run
    converted = tf.saved_model.load(converted_dir).signatures["serving_default"]

    feed = {name: tf.constant(rng.standard_normal(shape).astype("float32"))}
    want, got = native(**feed), converted(**feed)
    worst = max(float(np.max(np.abs(got[k].numpy() - want[k].numpy()))) for k in want)
    ok = all(np.allclose(got[k].numpy(), want[k].numpy(), rtol=1e-4, atol=1e-4) for k in want)
    native_ms = _latency_ms(native, feed, args.runs)
    converted_ms = _latency_ms(converted, feed, args.runs)
    # the converted model's ops (an op of the same name may remain from the converter: it has a longer key)
    served = [n.name for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    stats = {k: trt.engine_op_stats()[k] for k in served}
    print(f"[demo] outputs match native TF: {ok} (max abs diff {worst:.2e}, tolerance 1e-4)")
    print(f"[demo] convert {convert_s:.2f} s, build {build_s:.2f} s; engine ops: "
          + ", ".join(f"{k}: {v['engines']} engine(s), {v['fallback_total']} fallback(s)" for k, v in stats.items()))
    backend = dispatcher.engine_backend()
    print(f"[demo] batch {args.batch} median latency: native TF {native_ms:.2f} ms, converted {converted_ms:.2f} ms "
          f"(engines on the {backend} backend{', GPU' if backend == 'cupy' else ', CPU'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
