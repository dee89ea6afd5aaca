"""Probe: what chained 1x1 convolutions (ops/conv_chain.py) give ResNet-50 (tests/engine/gpu/gpu_resnet50.py): for
each precision, the engine as the build chooses (chains where they time faster) against the same network built
with TFTRT_PY_CONV_CHAIN=0, in one process, timed back to back in alternating rounds; the chains chosen, each
with its time and the two layers' own; the logits of the two engines compared. GPU machine only.

    python benchmarks/probes/conv_chain_probe.py [--batch 128] [--precisions FP16 INT8 FP8]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "engine", "gpu"))

import gpu_resnet50  # noqa: E402
from gpu_calibrate import apply_ranges, max_abs_ranges  # noqa: E402

from tftrt_py.engine import Builder, BuilderConfig  # noqa: E402


def build(model, batch, precision, ranges, chain):
    """The engine and an execution context, TFTRT_PY_CONV_CHAIN unset (`chain` None) or set to `chain`."""
    if chain is None:
        os.environ.pop("TFTRT_PY_CONV_CHAIN", None)
    else:
        os.environ["TFTRT_PY_CONV_CHAIN"] = chain
    net = gpu_resnet50.network(batch, 224, model)
    if precision in ("INT8", "FP8"):
        apply_ranges(net, ranges)
    engine = Builder(BuilderConfig(precision=precision, backend="cupy")).build_engine(net)
    return engine, engine.create_execution_context()


def main():
    import cupy

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--precisions", nargs="+", default=["FP16", "INT8", "FP8"])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    model = gpu_resnet50.spec()
    rng = np.random.default_rng(0)
    calib = [{"input": cupy.asarray(rng.standard_normal((8, 224, 224, 3)).astype(np.float32))} for _ in range(2)]
    ranges = max_abs_ranges(lambda: gpu_resnet50.network(8, 224, model), calib, backend="cupy")
    x = cupy.asarray(rng.standard_normal((args.batch, 224, 224, 3)).astype(np.float32))

    def call_ms(ctx, name, calls=50):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(calls):
            ctx.execute({name: x})
        end.record()
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) / calls

    for precision in args.precisions:
        (chained, ctx_c), (_, ctx_a) = (build(model, args.batch, precision, ranges, chain) for chain in (None, "0"))
        name = chained.inputs[0].name
        got, ref = (cupy.asnumpy(ctx.execute({name: x})["logits"]).astype(np.float64) for ctx in (ctx_c, ctx_a))
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        times = {ctx_c: [], ctx_a: []}
        for ctx in times:
            call_ms(ctx, name, 10)
        for _ in range(args.rounds):
            for ctx in times:
                times[ctx].append(call_ms(ctx, name))
        mc, ma = statistics.median(times[ctx_c]), statistics.median(times[ctx_a])
        print(f"{precision} batch {args.batch}: chains as built {mc:.4f} ms ({args.batch / mc * 1e3:,.0f} img/s), "
              f"none {ma:.4f} ms ({args.batch / ma * 1e3:,.0f} img/s): {ma - mc:+.4f} ms; logits relative "
              f"difference {err:.1e}", flush=True)
        for layer, tactic in chained.tactics.items():
            if "chain" in tactic:
                c = tactic["chain"]
                print(f"  {layer} chained: {c['op']} tile {c['tile']}, {c['ms']} ms against {c['apart_ms']} apart")
        os.environ.pop("TFTRT_PY_CONV_CHAIN", None)


if __name__ == "__main__":
    main()
