"""Our Triton int8 / FP8 kernel as BERT-base's four GEMMs (ops/triton_conv.py triton_matmul_candidates: a 1x1
convolution over the rows) against cuBLASLt's quantized GEMMs and our FP16 tactic, at 4096 tokens (batch 32,
seq 128), each timed through the backend's tuner as the engine times it: the quantized layer reads its quantized
input and writes what the INT8 data flow writes (the FFN expansion, GELU fused, writes its output quantized for the
FFN contraction; the others fp16). PyTorch's fp16 ``linear`` (+ GELU) beside it. Each Triton winner is checked
against the cuBLAS int8 GEMM (FP8: cuBLASLt's E4M3 GEMM) on the same operands. GPU machine only; a table last.

    python benchmarks/probes/quantized_gemm_probe.py [--rows 4096] [--precisions INT8 FP8] [--tiles BM,BN,BK,W,S;...]
                                              [--gemms qkv out ffn1 ffn2]

H100, 2026-11-25, us (our fp16 tactic / Triton INT8 / Triton FP8; cuBLAS(Lt) int8 / E4M3 with their epilogue pass):
QKV 26.0 / 21.3 / 20.0 (74.6 / 70.4), output projection 10.5 / 9.8 / 9.2 (27.8 / 25.9), FFN expansion with GELU,
quantized out, 34.7 / 26.9 / 24.2 (100.4 / 93.2), FFN contraction 28.4 / 21.3 / 21.2 (38.9 / 36.1); the quantize
step of a [4096, 768] fp16 tensor 4.1 (INT8) and 4.0 us (FP8). Most winners: 128x128x128 tiles, 4 warps, 3 stages,
2 or 4 programs an SM. The FFN expansion's int8 output clamped in fp16 (the kernel's CLAMP16): 27.2 -> 25.6 us.

Tiles against SMs (--rows): the FFN contraction runs 22.0 us at 4096 rows (192 tiles of 128x128 for 132 SMs) and
22.6 at 5632 (264 tiles), QKV 21.8 and 25.5: a quarter of the GEMM is a last round on part of the SMs. Tried and
dropped (2026-11-25): summing those tiles' K in parts across programs, partial int32 sums through a workspace and a
counter a tile (split-K of the last round, and Stream-K over all steps): correct, but slower (FFN contraction
22.6-35 us, QKV 29-36); quantizing the fp16 input inside the GEMM instead of a quantize step: QKV 42.3 us (the
operand tile through registers and back to shared memory). Tiles of 128x192 (a variant of the kernel with two dots
on the same rows: the FFN contraction as 128 tiles, one round): exact, but never chosen for a BERT GEMM in INT8 or
FP8 (2026-11-25; Triton's 8-warp kernels load part of their operands through registers), so the kernel has none.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from tftrt_py.engine import Network  # noqa: E402

#: name -> (K, N, activation, output quantized in the INT8 data flow)
GEMMS = {"qkv": (768, 2304, None, False), "out": (768, 768, None, False),
         "ffn1": (768, 3072, {"type": "gelu_erf"}, True), "ffn2": (3072, 768, None, False)}
RANGE = 4.0


def layer_for(name: str, rows: int):
    k, n, act, quantized_out = GEMMS[name]
    rng = np.random.default_rng(0)
    net = Network(f"probe_{name}")
    x = net.add_input("x", "float16", (rows, k))
    x.dynamic_range = RANGE
    w = net.add_constant((rng.standard_normal((k, n)) * 0.02).astype(np.float16), name=f"{name}.w")
    params = {}
    if act:
        params["activation"] = act
    layer = net.add_layer("MatrixMultiply", [x, w], params,
                          {"bias": (rng.standard_normal(n) * 0.02).astype(np.float32)}, name=name)
    layer.outputs[0].dynamic_range = RANGE
    return layer, quantized_out


def torch_us(torch, name, rows, iters=200):
    k, n, act, _ = GEMMS[name]
    x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    b = torch.zeros(n, device="cuda", dtype=torch.float16)

    def f():
        y = torch.nn.functional.linear(x, w, b)
        return torch.nn.functional.gelu(y) if act else y

    for _ in range(20):
        f()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        f()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters * 1e3


def main():
    import logging

    import cupy

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--precisions", nargs="+", default=["INT8", "FP8"])
    parser.add_argument("--tiles", help="kernels instead of triton_conv.GEMM_TILES: BM,BN,BK,warps,stages;...")
    parser.add_argument("--gemms", nargs="+", default=list(GEMMS), choices=list(GEMMS))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    from tftrt_py.engine.backends import get_backend
    from tftrt_py.engine.backends.cupy.ops import BuildOptions, Spec, triton_conv
    from tftrt_py.engine.backends.cupy.ops.matmul import matmul_candidates
    from tftrt_py.engine.backends.cupy.ops.quant import FORMATS, QuantizeOp, quantized_shape
    from tftrt_py.engine.backends.cupy.quant_planning import quant_plan
    from tftrt_py.engine.backends.cupy.tactics import Tuner

    if args.tiles:
        triton_conv.GEMM_TILES = tuple(tuple(int(v) for v in t.split(",")) for t in args.tiles.split(";"))
    backend = get_backend("cupy")
    print(f"GPU {backend.device}; {args.rows} rows; tiles {triton_conv.GEMM_TILES}", flush=True)
    opts = BuildOptions()
    opts.tuner = backend._tuning_context()
    tuner = Tuner(opts.tuner, opts)
    try:
        import torch
    except ImportError:
        torch = None
    rows = []
    for name in args.gemms:
        layer, quantized_out = layer_for(name, args.rows)
        x = layer.inputs[0]
        out = layer.outputs[0].shape
        f16 = Spec(layer, [x.shape, layer.inputs[1].shape], ["float16"] * 2, [out], ["float16"], "float16", opts)
        f16_best = tuner._time_all(f16, matmul_candidates(f16))[0]
        row = {"gemm": name, "fp16": f16_best.ms * 1e3, "torch": torch_us(torch, name, args.rows) if torch else None}
        for precision in args.precisions:
            fmt = FORMATS[precision]
            operands, quant = quant_plan(layer, precision)
            i, shape, last, tr = operands[0]
            q = Spec(layer, [quantized_shape(shape, last, tr)], [fmt.storage], [out],
                     [fmt.storage if quantized_out else "float16"], "float16", opts, quant=quant)
            timed = tuner._time_all(q, matmul_candidates(q))
            own = [op for op in timed if op.tactic["op"].startswith("triton")]
            lib = [op for op in timed if not op.tactic["op"].startswith("triton")]
            row[precision] = own[0].ms * 1e3 if own else None
            row[precision + " tile"] = own[0].tactic["tile"] if own else None
            row[precision + " lib"] = lib[0].ms * 1e3 if lib else None
            if own and lib:  # the same operands through both: quantized steps apart, or fp16 max relative diff
                ins, outs = tuner._io(q.in_shapes, q.in_dtypes, q.out_shapes, q.out_dtypes)
                ref = cupy.empty_like(outs[0])
                opts.tuner.ensure_workspace(max(own[0].workspace, lib[0].workspace, 1))
                with opts.tuner.stream:
                    own[0].run(opts.tuner, ins, outs)
                    lib[0].run(opts.tuner, ins, [ref])
                opts.tuner.stream.synchronize()
                if quantized_out:
                    a, b = outs[0].view(cupy.int8).astype(cupy.int32), ref.view(cupy.int8).astype(cupy.int32)
                    row[precision + " check"] = f"{float((a != b).mean()) * 100:.2f}% codes differ"
                else:
                    a, b = outs[0].astype(cupy.float32), ref.astype(cupy.float32)
                    row[precision + " check"] = f"max diff {float(cupy.abs(a - b).max() / cupy.abs(b).max()):.1e}"
            tuner.release()
        rows.append(row)
        print(row, flush=True)
        cupy.get_default_memory_pool().free_all_blocks()
    print(f"\n{'gemm':<6} {'torch us':>9} {'fp16 us':>8}", end="")
    for p in args.precisions:
        print(f" {p + ' us':>8} {p + ' lib':>9} {'ratio':>6}", end="")
    print("  tiles / checks")
    totals = {"fp16": 0.0, **{p: 0.0 for p in args.precisions}}
    for r in rows:
        print(f"{r['gemm']:<6} {r['torch'] or float('nan'):9.1f} {r['fp16']:8.1f}", end="")
        totals["fp16"] += r["fp16"]
        for p in args.precisions:
            best = min(v for v in (r[p], r[p + " lib"], r["fp16"]) if v is not None)
            totals[p] += best
            print(f" {r[p] or float('nan'):8.1f} {r[p + ' lib'] or float('nan'):9.1f} "
                  f"{r['fp16'] / r[p] if r[p] else float('nan'):5.2f}x", end="")
        print("  " + " / ".join(f"{r.get(p + ' tile')} {r.get(p + ' check', '')}" for p in args.precisions))
    print("sums (the fastest of each GEMM's choices, us): " + ", ".join(f"{k} {v:.1f}" for k, v in totals.items()))
    shape = (args.rows, 768)
    for p in args.precisions:  # the quantize step a LayerNorm's output takes before a quantized GEMM
        f = FORMATS[p]
        step = QuantizeOp(shape, "float16", f.scale(RANGE), shape[-1], qfunc=f.qfunc)
        print(f"{p} quantize step of a [{shape[0]}, 768] fp16 tensor: "
              f"{tuner.op_ms(step, [shape], ['float16'], [shape], [f.storage]) * 1e3:.1f} us")


if __name__ == "__main__":
    main()
