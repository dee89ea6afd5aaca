"""`make demo`: build a sample SavedModel, convert it, save, reload, check against native TF, time native TF and
the converted model on each CPU engine backend (a process serves one backend: the others run in fresh processes).

    python models/demo.py [--model small_cnn|resnet50|...] [--batch 8] [--out out/demo]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from sample_models import MODELS, save_model  # noqa: E402
from tftrt_py import trt_convert as trt  # noqa: E402
from tftrt_py.engine_op import op as engine_op  # noqa: E402

CPU_BACKENDS = ("onnxruntime", "numpy")


def _latency_ms(fn, feed, runs):
    fn(**feed)  # warm-up (and, for the converted model, engine look-up)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn(**feed)
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def _served_ms(converted, feed, runs: int) -> str:
    """The converted signature's median latency on this process's backend, or why it did not serve."""
    def fallbacks():
        return sum(s["fallback_total"] for s in trt.engine_op_stats().values())

    before = fallbacks()
    ms = _latency_ms(converted, feed, runs)
    return f"{ms:.2f} ms" if fallbacks() == before else "failed (native segments ran)"


def _served_elsewhere(backend: str, args, converted_dir: str, feed_path: str) -> str:
    """_served_ms in a fresh process serving on `backend` (a process picks its engine backend once)."""
    command = [sys.executable, os.path.abspath(__file__), "--serve", converted_dir, feed_path, "--runs", str(args.runs)]
    run = subprocess.run(command, env=dict(os.environ, TFTRT_PY_BACKEND=backend), capture_output=True, text=True)
    if run.returncode == 0 and run.stdout.strip():
        return run.stdout.strip().splitlines()[-1]
    return f"unavailable ({(run.stderr.strip().splitlines() or ['?'])[-1]})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small_cnn", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", default=os.path.join("out", "demo"))
    parser.add_argument("--serve", nargs=2, metavar=("CONVERTED_DIR", "FEED_NPZ"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:  # a fresh process timing the converted model on its backend (TFTRT_PY_BACKEND)
        converted_dir, feed_path = args.serve
        converted = tf.saved_model.load(converted_dir).signatures["serving_default"]
        print(_served_ms(converted, {k: tf.constant(v) for k, v in np.load(feed_path).items()}, args.runs))
        return 0

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
    feed_path = os.path.join(args.out, "feed.npz")
    np.savez(feed_path, **{k: v.numpy() for k, v in feed.items()})
    backend = engine_op.engine_backend()
    timings = {backend: _served_ms(converted, feed, args.runs)}
    timings.update({b: _served_elsewhere(b, args, converted_dir, feed_path) for b in CPU_BACKENDS if b != backend})
    # the converted model's ops (an op of the same name may remain from the converter: it has a longer key)
    served = [n.name for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    stats = {k: trt.engine_op_stats()[k] for k in served}
    print(f"[demo] outputs match native TF: {ok} (max abs diff {worst:.2e}, tolerance 1e-4)")
    print(f"[demo] convert {convert_s:.2f} s, build {build_s:.2f} s; engine ops: "
          + ", ".join(f"{k}: {v['engines']} engine(s), {v['fallback_total']} fallback(s)" for k, v in stats.items()))
    print(f"[demo] batch {args.batch} median latency: native TF {native_ms:.2f} ms; converted, engines on "
          + ", ".join(f"{b}{' (GPU)' if b == 'cupy' else ''}: {ms}" for b, ms in timings.items()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
