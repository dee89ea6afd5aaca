"""BLAS oversubscription: a ResNet-18-like engine on the numpy backend, with and without another process
holding a core, BLAS at its own thread count (no cap) or capped by tftrt_py's thread settings.

    python benchmarks/cpu_threads.py [--batch 1] [--size 112] [--runs 20]

Without TensorFlow: the engine network is built from engine layers (ResNet-18's basic blocks, random
weights). Prints the median latency of each setting; the cap is what TFTRT_PY_CPU_THREADS (or OMP/OpenBLAS
variables, or TensorFlow's intra-op setting) gives engines.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from threadpoolctl import ThreadpoolController  # noqa: E402

from tftrt_py.engine import Builder, Network, runtime  # noqa: E402
from tftrt_py.engine.backends.threads import THREADS_ENV, cpu_threads  # noqa: E402

RNG = np.random.default_rng(0)


def conv(net, x, out_ch, k, stride, relu=True):
    pad = k // 2
    return net.add_layer("Convolution", [x], dict(
        strides=[stride] * 2, dilations=[1, 1], pre_padding=[pad] * 2, post_padding=[pad] * 2, groups=1,
        activation={"type": "relu"} if relu else None), {
        "kernel": (RNG.standard_normal((k, k, x.shape[-1], out_ch)) / np.sqrt(k * k * x.shape[-1])).astype("float32"),
        "bias": (0.1 * RNG.standard_normal(out_ch)).astype("float32")}).outputs[0]


def resnet18(batch: int, size: int) -> Network:
    """ResNet-18's layers (batch norm folded into conv biases): stem, 4 stages of 2 basic blocks, head."""
    net = Network("resnet18")
    x = conv(net, net.add_input("x", "float32", (batch, size, size, 3)), 64, 7, 2)
    x = net.add_layer("Pooling", [x], dict(type="max", window=[3, 3], strides=[2, 2], pre_padding=[1, 1],
                                           post_padding=[1, 1])).outputs[0]
    for stage, width in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage and not block else 1
            skip = conv(net, x, width, 1, stride, relu=False) if stride == 2 else x
            y = conv(net, conv(net, x, width, 3, stride), width, 3, 1, relu=False)
            y = net.add_layer("ElementWise", [y, skip], dict(op="sum")).outputs[0]
            x = net.add_layer("Activation", [y], dict(type="relu")).outputs[0]
    x = net.add_layer("Reduce", [x], dict(op="mean", axes=[1, 2], keep_dims=False)).outputs[0]
    w = net.add_constant((RNG.standard_normal((512, 1000)) / 23).astype("float32"))
    net.mark_output(net.add_layer("MatrixMultiply", [x, w]).outputs[0])
    return net


@contextlib.contextmanager
def busy_core(on: bool):
    """Another process spinning on one core while the block runs."""
    if not on:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        proc.kill()
        proc.wait()


def median_ms(ctx, x, runs: int) -> float:
    ctx.execute_v2([x])
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        ctx.execute_v2([x])
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    ctx = Builder().build_engine(resnet18(args.batch, args.size)).create_execution_context()
    x = RNG.standard_normal((args.batch, args.size, args.size, 3)).astype("float32")
    own = ThreadpoolController().select(user_api="blas").info()[0]["num_threads"]
    print(f"ResNet-18-like engine, batch {args.batch}, {args.size}x{args.size}, numpy backend; "
          f"{len(os.sched_getaffinity(0))} CPUs, BLAS's own thread count {own}, cpu_threads() {cpu_threads()}")
    settings = {f"no cap (BLAS's own {own})": None, **{f"capped at {n}": n for n in sorted({1, own})}}
    for busy in (False, True):
        with busy_core(busy):
            for label, n in settings.items():
                env = {THREADS_ENV: str(n)} if n else {}
                patch = mock.patch.object(runtime, "blas_limit", contextlib.nullcontext) if n is None else \
                    contextlib.nullcontext()
                with mock.patch.dict(os.environ, env), patch:
                    ms = median_ms(ctx, x, args.runs)
                print(f"{'one core held by a busy process' if busy else 'idle machine':32s} {label:22s} "
                      f"{ms:8.1f} ms")


if __name__ == "__main__":
    main()
