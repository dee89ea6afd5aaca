"""GPU engine build time with a fresh and a warm timing cache, each in its own process: ResNet-50 (INT8, FP16)
and a BERT-base encoder (FP16, INT8) built with the Network API (random weights), as the converter's engine ops
build them.

    python benchmarks/engine_build_time.py [--resnet-batches 1 128] [--bert-layers 12] [--bert-batch 32]

The fresh process starts with an empty timing cache (TFTRT_PY_TIMING_CACHE in a new folder) and empty cupy and
Triton kernel caches; the warm process reuses all three. Each row: build seconds (network to a GPU program ready to
run, tactics chosen), whether the warm build chose the same tactics, and the median latency of both engines (the same
tactics must run as fast). INT8 ranges come from max |value| over two random batches through an FP32 engine (that
build is not timed). ``--profile N`` prints each build's N most expensive functions (cProfile, cumulative).
"""
from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(args) -> None:
    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "engine", "gpu")]
    import cupy
    import numpy as np

    import gpu_bert as bert
    import gpu_resnet50 as resnet50
    from gpu_calibrate import apply_ranges, max_abs_ranges
    from tftrt_py.engine import Builder, BuilderConfig

    rng = np.random.default_rng(0)
    cases = []
    if args.resnet_batches:
        cnn = resnet50.spec()
        calib = [{"input": cupy.asarray(rng.standard_normal((8, 224, 224, 3)).astype(np.float32))} for _ in range(2)]
        cnn_ranges = max_abs_ranges(lambda: resnet50.network(8, 224, cnn), calib, backend="cupy")
        for batch in args.resnet_batches:
            for precision in ("INT8", "FP16"):
                cases.append((f"resnet50 b{batch}", precision, lambda b=batch: resnet50.network(b, 224, cnn),
                              cnn_ranges, {"input": rng.standard_normal((batch, 224, 224, 3)).astype(np.float32)}))
    if args.bert_layers:
        encoder, layers, seq = bert.spec(), args.bert_layers, 128
        calib = [{"x": cupy.asarray(rng.standard_normal((8, seq, 768)).astype(np.float32))} for _ in range(2)]
        bert_ranges = max_abs_ranges(lambda: bert.network(8, seq, encoder, dtype="float32", layers=layers), calib,
                                     backend="cupy")
        for precision in ("FP16", "INT8"):
            cases.append((f"bert {layers} layers b{args.bert_batch}", precision,
                          lambda: bert.network(args.bert_batch, seq, encoder, layers=layers), bert_ranges,
                          {"x": rng.standard_normal((args.bert_batch, seq, 768)).astype(np.float16)}))
    rows = []
    for name, precision, network, ranges, feed in cases:
        net = network()
        if precision in ("INT8", "FP8"):
            apply_ranges(net, ranges)
        profiler = cProfile.Profile() if args.profile else None
        start = time.perf_counter()
        if profiler:
            profiler.enable()
        engine = Builder(BuilderConfig(precision=precision, backend="cupy")).build_engine(net)
        engine.prepare()
        seconds = time.perf_counter() - start
        if profiler:
            profiler.disable()
            print(f"  profile of {name} {precision} ({os.environ['TFTRT_PHASE']} caches):", file=sys.stderr)
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(args.profile)
        ctx = engine.create_execution_context()
        inputs = {k: cupy.asarray(v) for k, v in feed.items()}
        for _ in range(5):
            ctx.execute(inputs)
        cupy.cuda.Device().synchronize()
        times = []
        for _ in range(30):
            t0 = time.perf_counter()
            ctx.execute(inputs)
            cupy.cuda.Device().synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        tactics = hashlib.sha256(json.dumps(engine.tactics, sort_keys=True, default=str).encode()).hexdigest()[:12]
        rows.append({"model": name, "precision": precision, "build_s": seconds, "ms": statistics.median(times),
                     "tactics": tactics})
        print(f"  {name} {precision}: build {seconds:.1f} s, {statistics.median(times):.3f} ms", file=sys.stderr,
              flush=True)
        del ctx, engine
    print(json.dumps({"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": rows}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resnet-batches", type=int, nargs="*", default=[1, 128])
    parser.add_argument("--bert-layers", type=int, default=12)
    parser.add_argument("--bert-batch", type=int, default=32)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print the N functions taking most time (cumulative) of each build (cProfile)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    caches = tempfile.mkdtemp(prefix="tftrt_build_time_")
    env = dict(os.environ, TFTRT_PY_TIMING_CACHE=os.path.join(caches, "timing_cache.json"),
               CUPY_CACHE_DIR=os.path.join(caches, "cupy"), TRITON_CACHE_DIR=os.path.join(caches, "triton"))
    command = [sys.executable, os.path.abspath(__file__), "--child", "--bert-layers", str(args.bert_layers),
               "--bert-batch", str(args.bert_batch), "--profile", str(args.profile),
               "--resnet-batches", *map(str, args.resnet_batches)]
    runs = {}
    for phase in ("fresh", "warm"):
        print(f"{phase} caches:", file=sys.stderr, flush=True)
        done = subprocess.run(command, env=dict(env, TFTRT_PHASE=phase), check=True, stdout=subprocess.PIPE, text=True)
        runs[phase] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{runs['fresh']['device']}, {time.strftime('%Y-%m-%d')}; build = network -> GPU program (tactics chosen)")
    print(f"{'engine':<26} {'precision':<9} {'fresh s':>8} {'warm s':>7} {'same tactics':>12} {'fresh ms':>9} "
          f"{'warm ms':>8}")
    for fresh, warm in zip(runs["fresh"]["rows"], runs["warm"]["rows"]):
        print(f"{fresh['model']:<26} {fresh['precision']:<9} {fresh['build_s']:8.1f} {warm['build_s']:7.1f} "
              f"{str(fresh['tactics'] == warm['tactics']):>12} {fresh['ms']:9.3f} {warm['ms']:8.3f}")


if __name__ == "__main__":
    main()
