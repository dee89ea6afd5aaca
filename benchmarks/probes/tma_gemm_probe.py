"""Probe: would TMA-fed tiles make our Triton int8 / FP8 GEMMs faster? BERT-base's four GEMMs at 4096 tokens
(int8 or E4M3 in, per-column dequantize, bias, GELU for the FFN expansion, fp16 out or requantized for the FFN
expansion) through (a) the engine's kernel (triton/quantized_conv.py, pointer loads pipelined by cp.async, as
ops/triton_conv.py runs a quantized MatrixMultiply) and (b) a persistent kernel whose operand tiles arrive by
tensor descriptors (TMA), optionally warp-specialised, with the same epilogue. Both launched by Triton's own
launcher (PyTorch tensors), timed with triton.testing.do_bench; outputs compared. GPU machine (sm_90) only; a
table last.

    python benchmarks/probes/tma_gemm_probe.py

H100, 2026-11-25 (do_bench, L2 flushed between runs), best of each, us, ours / TMA: INT8 QKV 25.3 / 25.4, output
projection 13.3 / 13.8, FFN expansion 30.4 / 29.6, FFN contraction 25.2 / 30.3; FP8 23.8 / 24.4, 12.3 / 14.0, 27.4 /
28.1, 24.1 / 24.8; outputs identical. Triton's descriptor loads (warp-specialised or not) were no faster than its
cp.async pipeline here, so the engine's kernel keeps pointer loads.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tftrt_py.engine.backends.cupy.triton.quantized_conv import _epilogue, _mma, conv_quantized  # noqa: E402

#: (BM, BN, BK, warps, stages, programs per SM, warp-specialised) of the TMA kernel
TMA_TILES = ((128, 128, 128, 4, 3, 1, False), (128, 128, 128, 8, 3, 1, False), (128, 256, 128, 8, 3, 1, False),
             (128, 128, 128, 4, 4, 1, False), (128, 128, 128, 8, 3, 1, True), (128, 256, 128, 8, 3, 1, True),
             (128, 128, 128, 4, 3, 2, False))
#: name -> (K, N, ACT, OUT)
GEMMS = {"qkv": (768, 2304, 0, 0), "out": (768, 768, 0, 0), "ffn1": (768, 3072, 2, 1), "ffn2": (3072, 768, 0, 0)}


@triton.jit
def gemm_tma(a, w, dq, bias, y, M, N, K, inv_out, ACT: tl.constexpr, OUT: tl.constexpr, FP8: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr, PROGRAMS: tl.constexpr,
             WS: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    w_desc = tl.make_tensor_descriptor(w, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    steps = tl.cdiv(K, BK)
    per_group = GROUP * tl.cdiv(N, BN)
    for tile in tl.range(tl.program_id(0), tiles, PROGRAMS, flatten=True, warp_specialize=WS):
        first = (tile // per_group) * GROUP
        rows = tl.minimum(tl.cdiv(M, BM) - first, GROUP)
        pm = first + (tile % per_group) % rows
        pn = (tile % per_group) // rows
        if FP8:
            acc = tl.zeros((BM, BN), dtype=tl.float32)
        else:
            acc = tl.zeros((BM, BN), dtype=tl.int32)
        for s in range(steps):
            x = a_desc.load([pm * BM, s * BK])
            b = w_desc.load([pn * BN, s * BK])
            acc = _mma(x, b.T, acc, FP8)
        offs_m = pm * BM + tl.arange(0, BM)
        offs_n = pn * BN + tl.arange(0, BN)
        _epilogue(acc, offs_m, offs_n, dq, bias, y, y, y, M, N, 1.0, inv_out, True, 0, ACT, OUT, FP8, False,
                  False)


def main():
    torch.manual_seed(0)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, table = 4096, []
    for fmt in ("INT8", "FP8"):
        qt = torch.int8 if fmt == "INT8" else torch.float8_e4m3fn
        for name, (k, n, act, out) in GEMMS.items():
            if fmt == "INT8":
                a = torch.randint(-127, 128, (rows, k), dtype=torch.int8, device="cuda")
                w = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
            else:
                a = (torch.randn(rows, k, device="cuda") * 2).to(qt)
                w = (torch.randn(n, k, device="cuda") * 2).to(qt)
            dq = torch.full((n,), 1e-4, device="cuda")
            bias = torch.randn(n, device="cuda") * 0.1
            ydt = (torch.int8 if fmt == "INT8" else qt) if out else torch.float16
            results = {}
            for bm, bn, bk, warps, stages, per_sm in ((128, 128, 128, 4, 3, 2), (128, 128, 128, 4, 3, 4),
                                                      (128, 256, 128, 8, 3, 2)):
                y = torch.empty(rows, n, dtype=ydt, device="cuda")
                grid = min(per_sm * sms, triton.cdiv(rows, bm) * triton.cdiv(n, bn))

                def run():
                    conv_quantized[(grid,)](a, w, dq, bias, y, y, y, rows, 1.0, 10.0, C=k, COUT=n, H=1, W=1, OH=1,
                                            OW=1, KH=1, KW=1, SH=1, SW=1, PH=0, PW=0, HAS_BIAS=True, RES=0, ACT=act,
                                            OUT=out, FP8=fmt == "FP8", BM=bm, BN=bn, BK=bk, GROUP=8, SMALL_C=0,
                                            SMALL_SUMS=False, CLAMP16=False, num_warps=warps, num_stages=stages)
                results[f"ptr {bm}x{bn}x{bk}/{warps}w{stages}s/{per_sm}"] = (triton.testing.do_bench(run) * 1e3, y)
            for bm, bn, bk, warps, stages, per_sm, ws in TMA_TILES:
                y = torch.empty(rows, n, dtype=ydt, device="cuda")
                programs = min(per_sm * sms, triton.cdiv(rows, bm) * triton.cdiv(n, bn))

                def run():
                    gemm_tma[(programs,)](a, w, dq, bias, y, rows, n, k, 10.0, ACT=act, OUT=out, FP8=fmt == "FP8",
                                          BM=bm, BN=bn, BK=bk, GROUP=8, PROGRAMS=programs, WS=ws, num_warps=warps,
                                          num_stages=stages)
                key = f"tma {bm}x{bn}x{bk}/{warps}w{stages}s/{per_sm}{' ws' if ws else ''}"
                try:
                    results[key] = (triton.testing.do_bench(run) * 1e3, y)
                except Exception as exc:
                    print(f"{fmt} {name} {key}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            ptr = min((v, key) for key, v in ((k_, v_[0]) for k_, v_ in results.items()) if key.startswith("ptr"))
            tma = [(v[0], key) for key, v in results.items() if key.startswith("tma")]
            best = min(tma) if tma else (float("nan"), "-")
            ref, got = results[ptr[1]][1], results[best[1]][1] if tma else None
            same = "-" if got is None else f"{float((ref.float() != got.float()).float().mean()) * 100:.3f}% differ"
            print(f"{fmt} {name}: " + ", ".join(f"{key} {v[0]:.1f}" for key, v in results.items()), flush=True)
            table.append((fmt, name, ptr, best, same))
    print(f"\n{'fmt':<5} {'gemm':<5} {'ours us':>8} {'tma us':>8} {'ratio':>6}  best ours / best tma / outputs")
    for fmt, name, ptr, best, same in table:
        print(f"{fmt:<5} {name:<5} {ptr[0]:8.1f} {best[0]:8.1f} {ptr[0] / best[0]:5.2f}x  "
              f"{ptr[1]} / {best[1]} / {same}")


if __name__ == "__main__":
    main()
