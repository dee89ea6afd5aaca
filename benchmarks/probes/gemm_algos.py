"""Where BERT's GEMM time goes: every cuBLASLt algorithm the heuristics offer for the four GEMMs of a BERT-base
layer (our LtGemm plans, the epilogues our engines use) against PyTorch's own calls for the same products, cuDNN's
matmul + bias + erf GELU graph for the FFN expansion (the exact GELU that cuBLASLt's epilogues lack), and the
kernels torch.compile and our FP16 engine run for the whole layer (torch.profiler). GPU machine only; prints a
table last.

    python benchmarks/probes/gemm_algos.py [--tokens 4096] [--algos 16] [--no-torch-profile]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

#: name -> (n, k, cuBLASLt epilogue, torch call) for rows x k @ k x n.
SHAPES = {"qkv": (2304, 768, "BIAS", "linear"), "out": (768, 768, "BIAS", "linear"),
          "ffn1": (3072, 768, "GELU_BIAS", "gelu_tanh"), "ffn2": (768, 3072, "BIAS", "linear")}


def time_ms(fn, stream, runs: int = 50) -> float:
    """Mean ms of `runs` back-to-back calls (after a warm-up), by events on `stream`."""
    import cupy

    for _ in range(5):
        fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(runs):
        fn()
    end.record(stream)
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / runs


def ours(rows: int, n: int, k: int, epilogue: str, algos: int):
    """[(algorithm index, ms)] of our cuBLASLt plan's algorithms for this GEMM."""
    import cupy

    from tftrt_py.engine.backends.cupy.cublaslt import LtGemm

    rng = np.random.default_rng(0)
    a = cupy.asarray(rng.standard_normal((rows, k)).astype(np.float16) * 0.1)
    w = cupy.asarray(rng.standard_normal((k, n)).astype(np.float16) * 0.1)
    bias = cupy.asarray(rng.standard_normal(n).astype(np.float16))
    d = cupy.empty((rows, n), np.float16)
    plan = LtGemm(rows, n, k, "float16", epilogue=epilogue, bias=bias, max_workspace=32 << 20, algos=algos)
    ws = cupy.empty(32 << 20, np.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    out = []
    with stream:
        for i in range(len(plan.algos)):
            out.append((i, time_ms(lambda i=i: plan.run(i, a.data.ptr, w.data.ptr, d.data.ptr, ws.data.ptr,
                                                        ws.nbytes, stream.ptr), stream)))
    return out


def cudnn_gelu(rows: int, n: int, k: int, plans: int = 8):
    """[(plan name, ms)] of cuDNN graphs computing gelu_erf(A @ W + bias) in one kernel (exact erf GELU, which
    cuBLASLt's epilogues lack), or the error that stopped it."""
    import cupy
    import cudnn

    rng = np.random.default_rng(0)
    a = cupy.asarray(rng.standard_normal((1, rows, k)).astype(np.float16) * 0.1)
    w = cupy.asarray(rng.standard_normal((1, k, n)).astype(np.float16) * 0.1)
    bias = cupy.asarray(rng.standard_normal((1, 1, n)).astype(np.float16))
    d = cupy.empty((1, rows, n), np.float16)
    handle = cudnn.create_handle()
    stream = cupy.cuda.Stream(non_blocking=True)
    cudnn.set_stream(handle, stream.ptr)
    half, f32 = cudnn.data_type.HALF, cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=half, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    A = g.tensor(name="A", dim=[1, rows, k], stride=[rows * k, k, 1], data_type=half)
    W = g.tensor(name="W", dim=[1, k, n], stride=[k * n, n, 1], data_type=half)
    B = g.tensor(name="B", dim=[1, 1, n], stride=[n, n, 1], data_type=half)
    y = g.matmul(A=A, B=W, compute_data_type=f32, name="mm")
    y = g.add(a=y, b=B, name="bias")
    y = g.gelu(input=y, name="gelu")
    y.set_output(True).set_data_type(half).set_dim([1, rows, n]).set_stride([rows * n, n, 1])
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    out = []
    for i in range(min(plans, g.get_execution_plan_count())):
        try:
            g.build_plan_at_index(i)
        except Exception as exc:
            out.append((f"plan {i}: {type(exc).__name__}", float("nan")))
            continue
        ws = cupy.empty(max(int(g.get_workspace_size_plan_at_index(i)), 1), np.uint8)
        pack = {A: a.data.ptr, W: w.data.ptr, B: bias.data.ptr, y: d.data.ptr}
        with stream:
            t = time_ms(lambda: g.execute_plan_at_index(pack, ws.data.ptr, index=i, handle=handle), stream)
        out.append((g.get_plan_name_at_index(i)[:40], t))
    from cupyx.scipy.special import erf

    ref = a[0, :256].astype(np.float32) @ w[0].astype(np.float32) + bias[0, 0]
    ref = 0.5 * ref * (1 + erf(ref / np.sqrt(2)))
    err = float(cupy.abs(d[0, :256].astype(np.float32) - ref).max())
    return out, err


def torch_ms(torch, rows: int, n: int, k: int, call: str) -> float:
    x = torch.randn(rows, k, device="cuda", dtype=torch.float16) * 0.1
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.1
    b = torch.randn(n, device="cuda", dtype=torch.float16)
    F = torch.nn.functional
    fn = {"linear": lambda: F.linear(x, w, b),
          "gelu_tanh": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)}[call]
    for _ in range(5):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(50):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 50


def kernels(torch, what: str, call, calls: int = 20) -> None:
    """The GPU kernels `calls` back-to-back calls of `call()` run (torch.profiler traces every kernel of the
    process, also those of our engines' CUDA graphs), per call, and the GPU time per call the loop took: what is
    not in the kernels is launch gaps and copies."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            call()
        end.record()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / calls, e.count // calls) for e in prof.key_averages()
            if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    wall = start.elapsed_time(end) * 1e3 / calls
    print(f"\n{what} kernels (us per call; {total:.1f} us in kernels, {wall:.1f} us of GPU time per call):")
    for key, us, count in rows[:14]:
        print(f"  {us:8.1f}  x{count}  {key[:110]}")


def layer_kernels(torch, batch: int, seq: int) -> None:
    """torch.compile's kernels for one BERT layer (default mode: no CUDA graph, so each kernel is traced), then
    our FP16 engine's for the same layer (its CUDA graph replayed, as served)."""
    import cupy

    from tests.engine.gpu import gpu_bert as bert
    from tftrt_py.engine import Builder, BuilderConfig

    model = bert.spec()
    block = bert.torch_block(model, torch).cuda().eval().half()
    fn = torch.compile(block)
    x = torch.randn(batch, seq, 768, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        kernels(torch, f"torch.compile BERT layer, batch {batch}", lambda: fn(x))
    engine = Builder(BuilderConfig(precision="FP16", backend="cupy")).build_engine(bert.network(batch, seq, model))
    ctx = engine.create_execution_context()
    xc = {engine.inputs[0].name: cupy.asarray(np.random.default_rng(0).standard_normal((batch, seq, 768)),
                                              dtype=np.float16)}
    kernels(torch, f"our FP16 BERT layer, batch {batch}", lambda: ctx.execute(xc))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096, help="GEMM rows (batch x sequence)")
    p.add_argument("--algos", type=int, default=16)
    p.add_argument("--no-torch-profile", action="store_true")
    args = p.parse_args(argv)
    import torch

    table = []
    for name, (n, k, epilogue, call) in SHAPES.items():
        flop = 2 * args.tokens * n * k
        times = ours(args.tokens, n, k, epilogue, args.algos)
        best = min(times, key=lambda r: r[1])
        first3 = min(t for i, t in times if i < 3)
        t_torch = torch_ms(torch, args.tokens, n, k, call)
        print(f"{name} [{args.tokens}x{k}] @ [{k}x{n}] {epilogue}: " +
              " ".join(f"{i}:{t * 1e3:.1f}" for i, t in times) + " us", flush=True)
        table.append((name, epilogue, first3, best, t_torch, flop))
        if name == "ffn1":
            try:
                plans, err = cudnn_gelu(args.tokens, n, k)
                print("cuDNN matmul + bias + erf GELU: " + ", ".join(f"{p} {t * 1e3:.1f} us" for p, t in plans) +
                      f" (max |err| {err:.1e})", flush=True)
            except Exception as exc:
                print(f"cuDNN matmul + bias + erf GELU failed: {type(exc).__name__}: {exc}", flush=True)
    if not args.no_torch_profile:
        layer_kernels(torch, args.tokens // 128, 128)
    print(f"\n{'gemm':<6} {'epilogue':<10} {'first 3 us':>10} {'best us':>8} {'algo':>5} {'torch us':>9} "
          f"{'TF/s best':>9} {'torch/best':>10}")
    for name, epilogue, first3, best, t_torch, flop in table:
        print(f"{name:<6} {epilogue:<10} {first3 * 1e3:>10.1f} {best[1] * 1e3:>8.1f} {best[0]:>5} "
              f"{t_torch * 1e3:>9.1f} {flop / best[1] / 1e9:>9.0f} {t_torch / best[1]:>10.2f}")


if __name__ == "__main__":
    main()
