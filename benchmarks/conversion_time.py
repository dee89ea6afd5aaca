"""Conversion time end to end, as a user converts: keras-hub BERT-base (FP16) and Keras ResNet50 (INT8, calibrated),
exported with random weights, then ``convert()`` (with INT8 calibration), ``build()`` and ``save()`` timed in a
fresh process with empty caches and again in a new process with those caches warm (timing cache, cupy and Triton
kernel caches, the CUDA driver's JIT cache).

    python benchmarks/conversion_time.py [--models bert resnet50] [--batch 8] [--profile N]

Figures are wall-clock seconds per stage, the process's imports excluded; the engines serve the batch given. The
engine op library, compiled once per TensorFlow version and install, is built (or found) by the export process
before the timed ones, and its time printed apart. Modules are imported from their bytecode, as from an install by
pip (which compiles it): tftrt_py's is compiled before the runs; where Python writes no bytecode
(PYTHONDONTWRITEBYTECODE) and packages were installed without it (pip --no-compile), every process compiles each
module it imports (about 0.4 s a stage for BERT-base on an H200 machine), which the output then warns of.
"""
from __future__ import annotations

import argparse
import compileall
import cProfile
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "models"), os.path.join(ROOT, "benchmarks")]

#: model -> (exporter in served_gpu, feed maker in served_gpu, precision)
MODELS = {"bert": ("bert_keras", "bert_feed", "FP16"), "resnet50": ("resnet50_keras", "resnet50_feed", "INT8")}


def export(name: str, directory: str) -> dict:
    """Export `name` to `directory`, then build (or find) the engine op library: built once per TensorFlow version
    and install, not per conversion, so the conversions timed after it do not include it."""
    import served_gpu

    getattr(served_gpu, MODELS[name][0])(directory)
    from tftrt_py.engine_op import library

    start = time.perf_counter()
    library.load()
    return {"op_library": time.perf_counter() - start}


def _profile_engine_ops() -> list:
    """TensorFlow runs engine ops on its own threads at times, which a profiler enabled in this one does not see
    before Python 3.12 (from 3.12 cProfile sees every thread, and only one may run): a call of the dispatcher's entry
    points (op creation; runs, which calibrate and build engines) on another thread gets a profiler of its own,
    appended to the list returned."""
    from tftrt_py.engine_op import dispatcher

    profiles, here = [], threading.get_ident()
    if sys.version_info >= (3, 12):
        return profiles
    for entry in ("create", "run"):
        def profiled(*args, _call=getattr(dispatcher, entry), **kwargs):
            if threading.get_ident() == here:  # the converting thread's profiler sees it
                return _call(*args, **kwargs)
            profiles.append(cProfile.Profile())
            return profiles[-1].runcall(_call, *args, **kwargs)

        setattr(dispatcher, entry, profiled)
    return profiles


def convert(name: str, source: str, out: str, batch: int, profile: int = 0) -> dict:
    import numpy as np

    import served_gpu

    stages, start = {}, time.perf_counter()
    import tensorflow as tf

    from tftrt_py import trt_convert as trt

    stages["imports"] = time.perf_counter() - start
    feed, precision = getattr(served_gpu, MODELS[name][1]), MODELS[name][2]
    rng = np.random.default_rng(0)

    def inputs():  # by name; one input positionally (Keras names it after its tensor, keras_tensor_<n>)
        arrays = {k: tf.constant(v) for k, v in feed(batch, rng).items()}
        return [arrays if len(arrays) > 1 else tuple(arrays.values())]

    profiler = cProfile.Profile() if profile else None
    engine_op_profiles = _profile_engine_ops() if profile else []
    if profiler:
        profiler.enable()
    params = trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(precision_mode=precision)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=source, conversion_params=params)
    start = time.perf_counter()
    if precision == "INT8":
        converter.convert(calibration_input_fn=lambda: iter(inputs() + inputs()))
    else:
        converter.convert()
    stages["convert"] = time.perf_counter() - start
    start = time.perf_counter()
    converter.build(input_fn=lambda: iter(inputs()))
    stages["build"] = time.perf_counter() - start
    start = time.perf_counter()
    converter.save(out, overwrite=True)
    stages["save"] = time.perf_counter() - start
    if profiler:
        profiler.disable()
        threads = [("converting thread", [profiler]), ("engine ops on other threads", engine_op_profiles)]
        for title, stats in ((t, pstats.Stats(*p, stream=sys.stderr)) for t, p in threads if p):
            for order in ("cumulative", "tottime"):
                print(f"== {name} {title}, by {order} time", file=sys.stderr)
                stats.sort_stats(order).print_stats(profile)
    stats = trt.engine_op_stats()
    stages["engine_ops"] = len(stats)
    stages["fallbacks"] = sum(s["fallback_total"] for s in stats.values())
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print each conversion's N functions of most cumulative and own time (cProfile), in the "
                             "converting thread and in the engine ops' runs (calibration, engine builds)")
    parser.add_argument("--child", nargs=3, metavar=("STEP", "MODEL", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        step, name, directory = args.child
        if step == "export":
            print(json.dumps(export(name, directory)))
        else:
            print(json.dumps(convert(name, directory, directory + "_trt", args.batch, args.profile)))
        return
    compileall.compile_dir(os.path.join(ROOT, "tftrt_py"), quiet=1)
    if sys.flags.dont_write_bytecode:
        print("warning: Python writes no bytecode here (PYTHONDONTWRITEBYTECODE): modules installed without it are "
              "compiled again by every process, inside the times below", file=sys.stderr, flush=True)
    work = tempfile.mkdtemp(prefix="tftrt_conversion_time_")
    try:
        env = dict(os.environ, TFTRT_PY_TIMING_CACHE=os.path.join(work, "timing_cache.json"),
                   CUPY_CACHE_DIR=os.path.join(work, "cupy"), TRITON_CACHE_DIR=os.path.join(work, "triton"),
                   CUDA_CACHE_PATH=os.path.join(work, "nv"),  # the driver's JIT cache (cuDNN's runtime plans)
                   TF_CPP_MIN_LOG_LEVEL="2")
        rows = []
        for name in args.models:
            source = os.path.join(work, name)
            done = subprocess.run([sys.executable, __file__, "--child", "export", name, source], env=env, check=True,
                                  stdout=subprocess.PIPE, text=True)
            library_s = json.loads(done.stdout.strip().splitlines()[-1])["op_library"]
            print(f"{name}: engine op library built or found in {library_s:.1f} s (once per TensorFlow version, "
                  f"before the conversions)", file=sys.stderr, flush=True)
            for phase in ("fresh", "warm"):
                done = subprocess.run([sys.executable, __file__, "--batch", str(args.batch), "--profile",
                                       str(args.profile), "--child", "convert", name, source], env=env, check=True,
                                      stdout=subprocess.PIPE, text=True)
                stages = json.loads(done.stdout.strip().splitlines()[-1])
                rows.append((name, MODELS[name][2], phase, stages))
                print(name, phase, stages, file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{time.strftime('%Y-%m-%d')}, batch {args.batch}; seconds (imports excluded from the total)")
    print(f"{'model':<10} {'precision':<9} {'caches':<6} {'convert':>8} {'build':>7} {'save':>6} {'total':>7} "
          f"{'engine ops':>10} {'fallbacks':>9}")
    for name, precision, phase, s in rows:
        total = s["convert"] + s["build"] + s["save"]
        print(f"{name:<10} {precision:<9} {phase:<6} {s['convert']:8.1f} {s['build']:7.1f} {s['save']:6.1f} "
              f"{total:7.1f} {s['engine_ops']:>10} {s['fallbacks']:>9}")


if __name__ == "__main__":
    main()
