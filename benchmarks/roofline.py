"""Each step of an engine against its floors: the GPU tests' ResNet-50 (Network API) and a BERT-base encoder layer
built in each precision; a call's time back to back, then every step of one call timed alone (the engine's
Profiler), beside the least time its bytes take at the device's copy bandwidth (inputs, outputs and weights read
or written once) and the least its multiply-adds take on the tensor cores at the GEMM rate measured in the run for
its precision (FP16: an fp16 GEMM, FP8: an E4M3 GEMM, through PyTorch; INT8: the larger of PyTorch's int8 GEMM
rate and the E4M3 one, as Hopper's tensor cores run both at one rate and PyTorch's int8 GEMM reaches less of it).
A fused step's multiply-adds are those of the network's layers it holds (named "a + b"). "Bound" is the larger
floor, "of bound" the share of the step's time it is. GPU machine only.

    python benchmarks/roofline.py --models resnet50 bert --precisions FP16 INT8 FP8 [--top 14]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "engine", "gpu"))

import gpu_bert as bert  # noqa: E402
import gpu_resnet50 as resnet50  # noqa: E402
import gpu_vs_torch  # noqa: E402
from gpu_calibrate import apply_ranges, max_abs_ranges  # noqa: E402

SIDE = 8192
#: Profiled calls a step's time is the mean of.
RUNS = 5


def _time(torch, fn, runs: int = 10) -> float:
    """Seconds a call of fn, on the GPU, after warm-up."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / runs


def ceilings(torch) -> dict:
    """Measured rates: multiply-add ops a second by precision (gpu_vs_torch's fp16 GEMM; an int8 and an E4M3 GEMM
    of SIDE), device copy bytes a second."""
    tflops, tbs = gpu_vs_torch.ceilings(torch)
    rates = {"FP16": tflops * 1e12, "copy": tbs * 1e12}
    ops = 2 * SIDE ** 3
    try:
        a8 = torch.randint(-127, 127, (SIDE, SIDE), device="cuda", dtype=torch.int8)
        rates["INT8"] = ops / _time(torch, lambda: torch._int_mm(a8, a8.t()))
    except Exception as exc:
        print(f"no int8 GEMM rate: {exc}")
    try:
        f8 = torch.randn(SIDE, SIDE, device="cuda", dtype=torch.float16).to(torch.float8_e4m3fn)
        one = torch.tensor(1.0, device="cuda")
        rates["FP8"] = ops / _time(torch, lambda: torch._scaled_mm(f8, f8.t(), scale_a=one, scale_b=one,
                                                                  out_dtype=torch.float16))
    except Exception as exc:  # a GPU without E4M3 GEMMs
        print(f"no FP8 GEMM rate: {exc}")
    if "FP8" in rates:
        rates["INT8"] = max(rates.get("INT8", 0.0), rates["FP8"])
    return rates


def step_ops(layer) -> int:
    """Multiply-add ops (2 a product) of a convolution or a matrix product; 0 for other layers."""
    if layer is None or not layer.inputs:
        return 0
    out = layer.outputs[0].shape
    if layer.kind == "Convolution":
        kh, kw, cin, cout = layer.weights["kernel"].shape
        return 2 * int(np.prod(out[:-1])) * kh * kw * cin * cout
    if layer.kind == "MatrixMultiply":
        a = layer.inputs[0].shape
        k = a[-2] if layer.params.get("transpose_a") else a[-1]
        return 2 * int(np.prod(out)) * k
    return 0


def rows(engine, ops: dict, records: dict, runs: int, rates: dict, precision: str):
    """(step, ms, MB, DRAM floor ms, tensor-core floor ms) of each profiled step (`runs` calls recorded; `ops`: the
    multiply-adds of each layer of the network as given, before fusion)."""
    prog = engine.cupy_program
    layers = {l.name: l for l in engine.network.layers}
    per = {}
    for step in prog.steps:
        nbytes = sum(prog.slots[n].nbytes for n in step.inputs + step.outputs if n in prog.slots)
        nbytes += int(getattr(step.op, "device_bytes", 0) or 0)
        auxiliary = step.layer.endswith(")")  # "<layers> (quantize)": a step a layer's input or output needs
        n_ops = 0 if auxiliary else sum(ops.get(part, 0) for part in step.layer.split(" + "))
        b, o = per.get(step.layer, (0, 0))
        per[step.layer] = (b + nbytes, o + n_ops)
    out = []
    for name, times in records.items():
        nbytes, ops = per.get(name, (0, 0))
        layer = layers.get(name)
        rate = rates.get(getattr(layer, "precision", None) or precision, rates["FP16"])
        out.append((name, sum(times) / runs, nbytes / 1e6, nbytes / rates["copy"] * 1e3,
                    ops / rate * 1e3 if ops else 0.0))
    return out


def report(label: str, table, top: int, call_ms: float) -> None:
    table = sorted(table, key=lambda r: -r[1])
    total = [sum(r[i] for r in table) for i in (1, 2, 3, 4)]
    bound_all = sum(max(r[3], r[4]) for r in table)
    print(f"\n{label}: a call {call_ms:.3f} ms back to back; {len(table)} steps, {total[0]:.3f} ms; bound "
          f"{bound_all:.3f} ms ({bound_all / total[0] * 100:.0f}% of the steps' time)")
    print("| step | ms | MB | DRAM floor ms | tensor-core floor ms | bound | of bound |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    shown = table[:top]
    for name, ms, mb, dram, tc in shown:
        bound = "DRAM" if dram >= tc else "tensor cores"
        parts = name.split(" + ")
        name = name if len(parts) <= 3 else f"{parts[0]} + {len(parts) - 1} fused"
        print(f"| {name} | {ms:.4f} | {mb:.1f} | {dram:.4f} | {tc:.4f} | {bound} | {max(dram, tc) / ms * 100:.0f}% |")
    rest = table[top:]
    if rest:
        ms, mb, dram, tc = (sum(r[i] for r in rest) for i in (1, 2, 3, 4))
        bound = sum(max(r[3], r[4]) for r in rest)
        print(f"| {len(rest)} other steps | {ms:.4f} | {mb:.1f} | {dram:.4f} | {tc:.4f} | | {bound / ms * 100:.0f}% |")


def profiled(engine, feed: dict, runs: int, calls: int = 50):
    """(ms a call over `calls` calls back to back, the Profiler's records of `runs` calls)."""
    import cupy

    from tftrt_py.engine import Profiler

    ctx = engine.create_execution_context()
    for _ in range(10):
        ctx.execute(feed)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(calls):
        ctx.execute(feed)
    end.record()
    end.synchronize()
    call_ms = cupy.cuda.get_elapsed_time(start, end) / calls
    ctx.profiler = Profiler()
    for _ in range(runs):
        ctx.execute(feed)
    records, ctx.profiler = ctx.profiler.records, None
    return call_ms, records


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["resnet50", "bert"], choices=["resnet50", "bert"])
    p.add_argument("--precisions", nargs="+", default=["FP16", "INT8", "FP8"])
    p.add_argument("--resnet-batch", type=int, default=128)
    p.add_argument("--bert-batch", type=int, default=32)
    p.add_argument("--top", type=int, default=14, help="steps shown one by one, the longest first")
    args = p.parse_args(argv)
    import cupy
    import torch

    from tftrt_py.engine import Builder, BuilderConfig

    rates = ceilings(torch)
    print(f"GPU {torch.cuda.get_device_name()}; measured: " + ", ".join(
        f"{k} GEMM {v / 1e12:.0f} TOP/s" for k, v in rates.items() if k != "copy") +
        f", device copy {rates['copy'] / 1e12:.2f} TB/s")
    rng = np.random.default_rng(0)
    for model in args.models:
        if model == "resnet50":
            spec, batch = resnet50.spec(), args.resnet_batch
            network = lambda b: resnet50.network(b, 224, spec)  # noqa: E731
            calib = [{"input": cupy.asarray(rng.standard_normal((8, 224, 224, 3)).astype(np.float32))}
                     for _ in range(2)]
            feed = {"input": cupy.asarray(rng.standard_normal((batch, 224, 224, 3)).astype(np.float32))}
        else:
            spec, batch = bert.spec(), args.bert_batch
            network = lambda b, dtype="float16": bert.network(b, 128, spec, dtype=dtype)  # noqa: E731
            calib = [{"x": cupy.asarray(rng.standard_normal((8, 128, spec["hidden"])).astype(np.float32))}
                     for _ in range(2)]
            feed = {"x": cupy.asarray(rng.standard_normal((batch, 128, spec["hidden"])).astype(np.float16))}
        ranges = None
        if {"INT8", "FP8"} & set(args.precisions):
            ranges = max_abs_ranges(
                (lambda: network(8)) if model == "resnet50" else (lambda: network(8, "float32")), calib,
                backend="cupy")
        for precision in args.precisions:
            net = network(batch)
            if precision in ("INT8", "FP8"):
                apply_ranges(net, ranges)
            ops = {layer.name: step_ops(layer) for layer in net.layers}
            engine = Builder(BuilderConfig(precision=precision, backend="cupy")).build_engine(net)
            call_ms, records = profiled(engine, feed, RUNS)
            table = rows(engine, ops, records, RUNS, rates, precision)
            report(f"{model} batch {batch} {precision}", table, args.top, call_ms)
            del engine
            cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
