"""Probe: would programmatic dependent launch (PDL) shorten an engine's CUDA graph? A chain shaped like a BERT
layer's INT8 steps at 4096 tokens (a memory-bound pass over a [4096, 768] fp16 tensor, as a LayerNorm or quantize
step, then an int8 GEMM with its fp16 output, alternating), captured in one CUDA graph, with and without PDL: each
kernel waits for its predecessor with ``griddepcontrol.wait`` (Triton's gdc_wait) and lets its successor launch
at its start (gdc_launch_dependents), launched with the programmatic-serialization attribute (Triton's
``launch_pdl``), so the next kernel's launch and block scheduling overlap this one's tail. Triton's own launcher,
PyTorch tensors and graphs; GPU machine only; a table last.

    python benchmarks/probes/pdl_probe.py [--pairs 4]
"""
from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _scale_rows(x, y, n, PDL: tl.constexpr, BLOCK: tl.constexpr):
    """y = x * 0.5 + 1 (fp16), a memory-bound pass standing for a LayerNorm or quantize step."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + offs, mask=offs < n).to(tl.float32)
    tl.store(y + offs, (v * 0.5 + 1.0).to(tl.float16), mask=offs < n)


@triton.jit
def _gemm(a, b, c, M, N, K, PDL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """c[M, N] = fp16(a[M, K] int8 @ b[N, K]^T int8), int32 sums; one tile a program."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BN)
    rm = (pid // grid_n) * BM + tl.arange(0, BM)
    rn = (pid % grid_n) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.int32)
    for k in range(0, K, BK):
        x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
        w = tl.load(b + rn[:, None] * K + (k + rk)[None, :])
        acc = tl.dot(x, tl.trans(w), acc, out_dtype=tl.int32)
    tl.store(c + rm[:, None] * N + rn[None, :], (acc.to(tl.float32) * 1e-3).to(tl.float16))


def chain(pdl: bool, pairs: int, t):
    """`pairs` x (pass over h, GEMM of its int8 stand-in), each kernel launched with `pdl`."""
    n = t["h"].numel()
    for _ in range(pairs):
        _scale_rows[(triton.cdiv(n, 2048),)](t["h"], t["g"], n, PDL=pdl, BLOCK=2048, launch_pdl=pdl)
        M, K = t["a"].shape
        N = t["b"].shape[0]
        _gemm[(triton.cdiv(M, 128) * triton.cdiv(N, 128),)](t["a"], t["b"], t["c"], M, N, K, PDL=pdl, BM=128,
                                                           BN=128, BK=128, num_warps=4, num_stages=3,
                                                           launch_pdl=pdl)


def timed_graph(fn, reps: int = 20, rounds: int = 7):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            g.replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / reps)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--n", type=int, default=3072, help="the GEMM's output channels (768: BERT's FFN contraction)")
    args = p.parse_args()
    dev = "cuda"
    t = {"h": torch.randn(4096, 768, device=dev, dtype=torch.float16),
         "g": torch.empty(4096, 768, device=dev, dtype=torch.float16),
         "a": torch.randint(-127, 128, (4096, 768), device=dev, dtype=torch.int8),
         "b": torch.randint(-127, 128, (args.n, 768), device=dev, dtype=torch.int8),
         "c": torch.empty(4096, args.n, device=dev, dtype=torch.float16)}
    results = {}
    for _ in range(2):  # interleaved: plain, PDL, plain, PDL
        for pdl in (False, True):
            results.setdefault(pdl, []).extend(timed_graph(lambda pdl=pdl: chain(pdl, args.pairs, t)))
    ref = t["c"].clone()
    chain(True, 1, t)
    torch.cuda.synchronize()
    same = torch.equal(ref, t["c"])
    plain, pdl = statistics.median(results[False]), statistics.median(results[True])
    kernels = 2 * args.pairs
    print(f"PDL probe (H100?) {torch.cuda.get_device_name()}: {args.pairs} pairs (pass over [4096, 768] fp16 + int8 "
          f"GEMM 4096x{args.n}x768), one CUDA graph, us a graph: plain {plain:.1f}, PDL {pdl:.1f}; saved "
          f"{(plain - pdl) / kernels:.2f} us a kernel boundary; outputs equal: {same}")


if __name__ == "__main__":
    main()
