"""Where an engine build's time goes: the GPU tests' Network-API ResNet-50 built on the cupy backend under cProfile
(INT8 ranges from max |value| over two random batches through the FP32 engine, as in gpu_vs_torch.py), the build's
wall time, the functions with the most cumulative and own time, and the tuner's candidates per layer kind.
GPU machine only.

    python benchmarks/build_profile.py [--precision INT8] [--batch 128] [--size 224] [--top 25]
"""
from __future__ import annotations

import argparse
import cProfile
import collections
import io
import os
import pstats
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "engine", "gpu")]

import gpu_resnet50 as resnet50  # noqa: E402
from gpu_calibrate import apply_ranges, max_abs_ranges  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precision", default="INT8", choices=["FP16", "INT8", "FP8"])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    import cupy

    from tftrt_py.engine import Builder, BuilderConfig

    model = resnet50.spec()
    net = resnet50.network(args.batch, args.size, model)
    if args.precision != "FP16":
        rng = np.random.default_rng(0)
        calib = [{"input": cupy.asarray(rng.standard_normal((8, args.size, args.size, 3)).astype(np.float32))}
                 for _ in range(2)]
        apply_ranges(net, max_abs_ranges(lambda: resnet50.network(8, args.size, model), calib, backend="cupy"))
    profiler = cProfile.Profile()
    start = time.perf_counter()
    engine = profiler.runcall(Builder(BuilderConfig(precision=args.precision, backend="cupy")).build_engine, net)
    seconds = time.perf_counter() - start
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(key).print_stats(args.top)
        print(f"\n--- by {key} ---\n" + "\n".join(out.getvalue().splitlines()[6:]), flush=True)
    kinds = collections.Counter()
    candidates = collections.Counter()
    for tactic in engine.tactics.values():
        kinds[str(tactic.get("op"))] += 1
        candidates[str(tactic.get("op"))] += int(tactic.get("candidates", 1))
    print(f"\nResNet-50 {args.precision} batch {args.batch}: build {seconds:.1f} s; ops (layers / candidates "
          f"timed): " + ", ".join(f"{k} {n}/{candidates[k]}" for k, n in kinds.most_common()))


if __name__ == "__main__":
    main()
