"""A Triton GEMM with bias and erf GELU in its epilogue (pointer loads, and a persistent kernel with TMA
descriptors) against PyTorch's cuBLAS GEMM + a GELU pass and cuBLASLt's fused tanh-GELU epilogue, at BERT-base and
ViT-B/16 shapes (batch 32): whether a GEMM of our own could fuse the erf GELU that cuBLASLt lacks. Microseconds per
call (triton.testing.do_bench), the fastest of a few tile configurations; GPU machine only; a table last.

    python benchmarks/probes/triton_gemm_probe.py
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def gemm_gelu(a_ptr, w_ptr, bias_ptr, c_ptr, M, N, K, ACT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    grid_m, grid_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    per_group = GROUP * grid_n
    first = (pid // per_group) * GROUP
    rows = min(grid_m - first, GROUP)
    pm = first + (pid % per_group) % rows
    pn = (pid % per_group) // rows
    offs_m = (pm * BM + tl.arange(0, BM)) % M
    offs_n = (pn * BN + tl.arange(0, BN)) % N
    offs_m = tl.max_contiguous(tl.multiple_of(offs_m, BM), BM)
    offs_n = tl.max_contiguous(tl.multiple_of(offs_n, BN), BN)
    offs_k = tl.arange(0, BK)
    a = a_ptr + offs_m[:, None] * K + offs_k[None, :]
    w = w_ptr + offs_k[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        acc = tl.dot(tl.load(a), tl.load(w), acc)
        a += BK
        w += BK * N
    acc += tl.load(bias_ptr + offs_n)[None, :].to(tl.float32)
    if ACT == 1:
        acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    cm = pm * BM + tl.arange(0, BM)
    cn = pn * BN + tl.arange(0, BN)
    tl.store(c_ptr + cm[:, None] * N + cn[None, :], acc.to(tl.float16), mask=(cm[:, None] < M) & (cn[None, :] < N))


@triton.jit
def gemm_gelu_tma(a_ptr, w_ptr, bias_ptr, c_ptr, M, N, K, ACT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr, GROUP: tl.constexpr, NUM_SMS: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    grid_m, grid_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    per_group = GROUP * grid_n
    k_tiles = tl.cdiv(K, BK)
    for tile in tl.range(tl.program_id(0), grid_m * grid_n, NUM_SMS, flatten=True):
        first = (tile // per_group) * GROUP
        rows = min(grid_m - first, GROUP)
        pm = first + (tile % per_group) % rows
        pn = (tile % per_group) // rows
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            acc = tl.dot(a_desc.load([pm * BM, ki * BK]), w_desc.load([ki * BK, pn * BN]), acc)
        cn = pn * BN + tl.arange(0, BN)
        acc += tl.load(bias_ptr + cn, mask=cn < N)[None, :].to(tl.float32)
        if ACT == 1:
            acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
        c_desc.store([pm * BM, pn * BN], acc.to(tl.float16))


CONFIGS = [(128, 256, 64, 3, 8), (128, 128, 64, 4, 4), (128, 128, 64, 3, 8), (128, 256, 64, 4, 8),
           (256, 128, 64, 3, 8), (128, 128, 32, 5, 4), (64, 256, 64, 4, 4), (128, 64, 64, 4, 4),
           (256, 128, 64, 4, 8)]

TMA_CONFIGS = [(128, 256, 64, 3, 8), (128, 128, 64, 4, 8), (128, 128, 64, 3, 4), (128, 256, 64, 4, 8),
               (128, 128, 128, 3, 8), (128, 256, 128, 2, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 4)]


def main() -> None:
    import torch
    from triton.testing import do_bench

    print("triton", triton.__version__, "torch", torch.__version__, flush=True)
    F = torch.nn.functional
    rows = []
    for name, (m, k, n) in {"bert ffn1 b32": (4096, 768, 3072), "vit ffn1 b32": (6304, 768, 3072),
                            "bert ffn2 b32": (4096, 3072, 768), "bert qkv b32": (4096, 768, 2304)}.items():
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(k, n, device="cuda", dtype=torch.float16) * k ** -0.5
        b = torch.randn(n, device="cuda", dtype=torch.float16)
        ref = F.gelu(torch.addmm(b.float(), a.float(), w.float()))
        t_sep = do_bench(lambda: F.gelu(torch.addmm(b, a, w)), rep=200)
        t_mm = do_bench(lambda: torch.addmm(b, a, w), rep=200)
        t_lt = do_bench(lambda: torch._addmm_activation(b, a, w, use_gelu=True), rep=200)
        best = None
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        variants = (("tma", gemm_gelu_tma, TMA_CONFIGS, sms, {"NUM_SMS": sms}), ("ptr", gemm_gelu, CONFIGS, None, {}))
        for label, kernel, configs, programs, extra in variants:
            for bm, bn, bk, stages, warps in configs:
                c = torch.empty(m, n, device="cuda", dtype=torch.float16)
                tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
                grid = (min(programs, tiles) if programs else tiles,)

                def call():
                    kernel[grid](a, w, b, c, m, n, k, ACT=1, BM=bm, BN=bn, BK=bk, GROUP=8, num_stages=stages,
                                 num_warps=warps, **extra)
                try:
                    call()
                    err = float((c.float() - ref).abs().max())
                    t = do_bench(call, rep=200)
                except Exception as exc:  # a configuration that does not fit (shared memory)
                    print(f"  {name} {label} {(bm, bn, bk, stages, warps)} failed: {str(exc)[:120]}")
                    continue
                print(f"  {name} {label} {(bm, bn, bk, stages, warps)}: {t * 1e3:.1f} us err {err:.2e}", flush=True)
                if best is None or t < best[0]:
                    best = (t, (label, bm, bn, bk, stages, warps), err)
        tflops = 2 * m * n * k / best[0] / 1e9
        rows.append((name, t_sep * 1e3, t_mm * 1e3, t_lt * 1e3, best[0] * 1e3, tflops, best[1], best[2]))
        print(f"{name}: torch mm+gelu {t_sep * 1e3:.1f} (mm {t_mm * 1e3:.1f}), cuBLASLt tanh-fused {t_lt * 1e3:.1f},"
              f" triton erf-fused {best[0] * 1e3:.1f} us {tflops:.0f} TFLOP/s {best[1]} err {best[2]:.2e}",
              flush=True)

    print(f"\n{'GEMM':<16} {'mm+gelu':>8} {'mm':>7} {'Lt tanh':>8} {'triton':>7} {'TFLOP/s':>7} {'sep/triton':>10}")
    for name, sep, mm, lt, tr, tf, cfg, err in rows:
        print(f"{name:<16} {sep:>8.1f} {mm:>7.1f} {lt:>8.1f} {tr:>7.1f} {tf:>7.0f} {sep / tr:>10.2f}  {cfg}")


if __name__ == "__main__":
    main()
