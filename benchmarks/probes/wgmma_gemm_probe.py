"""Probe: a Hopper GEMM of our own with the bias and erf GELU in its epilogue, C[M,N] = gelu(A[M,K] B[N,K]^T + bias)
(fp16, fp32 accumulators), against PyTorch's cuBLAS GEMM + GELU pass at BERT-base's and ViT-B/16's FFN expansion
(batch 32): whether fusing the erf GELU that cuBLASLt's epilogues lack pays. One producer warpgroup loads A and B
tiles by TMA (128-byte swizzle) into a ring of stages guarded by mbarriers; two consumer warpgroups run
m64nBNk16 wgmma on them and apply the epilogue from registers. Variants: a 2-CTA cluster multicasting B, a
persistent grid (the next tile's loads overlap this tile's epilogue), and the GEMM without its stores or without
its MMAs (what the loads and the epilogue cost alone). Compiled by NVRTC for sm_90a, launched through the driver
(tensor maps as __grid_constant__ parameters). GPU machine (sm_90) only; a table last.

H100, 2026-11-24: BERT 54.9 us (persistent) against cuBLAS 40.6 + the GELU pass = 58.4; ViT 85.1 against 85.9.
The persistent kernel's loads alone (no MMAs, no stores) take 38.9 us, as long as cuBLAS's whole GEMM: 226 MB
through L2 for 128x256 tiles at 5.8 TB/s. Multicasting B across a 2-CTA cluster (151 MB) made the loads alone
slower here (48.9 us), so the traffic cuBLAS avoids stays; this kernel was not taken into the engine.

    python benchmarks/probes/wgmma_gemm_probe.py [bert|vit]
"""
from __future__ import annotations

import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

SOURCE = r"""
struct __align__(64) TMap { unsigned long long v[16]; };

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned phase) {
  asm volatile("{\n .reg .pred p;\n WAIT_%=:\n"
               " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               " @!p bra WAIT_%=;\n}" :: "r"(smem_u32(bar)), "r"(phase) : "memory");
}
__device__ __forceinline__ void mbar_arrive_peer(unsigned long long* bar, unsigned peer) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(peer));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
}
__device__ __forceinline__ void tma_load_multicast(void* dst, const TMap* map, int c0, int c1,
                                                   unsigned long long* bar, unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2, %3}], [%4], %5;"
               :: "r"(smem_u32(dst)), "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(smem_u32(bar)), "h"(mask)
               : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n barrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const TMap* map, int c0, int c1, unsigned long long* bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               :: "r"(smem_u32(dst)), "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(smem_u32(bar)) : "memory");
}
// K-major tile, rows of 64 halves (128 bytes), 128-byte swizzle: 8-row atoms 1024 bytes apart.
__device__ __forceinline__ unsigned long long desc(const void* p) {
  unsigned long long a = (smem_u32(p) & 0x3FFFF) >> 4;
  return a | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

#if CLUSTER
#define RELEASE(bar) do { mbar_arrive(bar); mbar_arrive_peer(bar, rank ^ 1); } while (0)
#else
#define RELEASE(bar) mbar_arrive(bar)
#endif

extern "C" __global__ void __launch_bounds__(384, 1)
#if CLUSTER && PERSISTENT
__cluster_dims__(2, 1, 1)
#elif CLUSTER
__cluster_dims__(1, 2, 1)
#endif
gemm_gelu(const __grid_constant__ TMap ta, const __grid_constant__ TMap tb, const float* __restrict__ bias,
          unsigned* __restrict__ c, int M, int N, int K) {
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* base = (unsigned char*)(((unsigned long long)raw + 1023) & ~1023ull);
  unsigned char* sa = base;                                  // STAGES x BM x 64 halves
  unsigned char* sb = base + STAGES * BM * 128;              // STAGES x BN x 64 halves
  unsigned long long* full = (unsigned long long*)(sb + STAGES * BN * 128);
  unsigned long long* empty = full + STAGES;
  int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
#if PERSISTENT
  // work units: a tile, or with CLUSTER a pair of tiles one above the other (one per CTA of the cluster, same B)
  const int tiles_n = N / BN, tiles_m = (M + BM - 1) / BM;
#if CLUSTER
  const int tiles = tiles_n * ((tiles_m + 1) / 2), first = blockIdx.x / 2, step = gridDim.x / 2;
#define TILE_M0(t) ((2 * ((t) / tiles_n) + rank) * BM)
#else
  const int tiles = tiles_n * tiles_m, first = blockIdx.x, step = gridDim.x;
#define TILE_M0(t) (((t) / tiles_n) * BM)
#endif
#else
  int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
#endif
  int kt_count = K / 64;
#if CLUSTER
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const unsigned consumers = 4;  // both CTAs' consumers release a stage: each CTA writes half of B into both
#else
  const unsigned consumers = 2;
#endif
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) { mbar_init(&full[s], 1); mbar_init(&empty[s], consumers); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
#if CLUSTER
  cluster_sync();
#endif
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (tid == 0) {
#if PERSISTENT
      int g = 0;
      for (int tile = first; tile < tiles; tile += step) {
      int m0 = TILE_M0(tile), n0 = (tile % tiles_n) * BN;
      for (int k_ = 0; k_ < kt_count; ++k_, ++g) {
        int kt = k_, s = g % STAGES;
        if (g >= STAGES) mbar_wait(&empty[s], ((g / STAGES) - 1) & 1);
#else
      for (int kt = 0; kt < kt_count; ++kt) {
        int s = kt % STAGES;
        if (kt >= STAGES) mbar_wait(&empty[s], ((kt / STAGES) - 1) & 1);
#endif
        mbar_expect(&full[s], (BM + BN) * 128);
        tma_load(sa + s * BM * 128, &ta, kt * 64, m0, &full[s]);
#if CLUSTER
        tma_load_multicast(sb + s * BN * 128 + rank * (BN / 2) * 128, &tb, kt * 64, n0 + rank * (BN / 2), &full[s], 3);
#else
        tma_load(sb + s * BN * 128, &tb, kt * 64, n0, &full[s]);
#endif
      }
#if PERSISTENT
      }
#endif
    }
#if CLUSTER
    cluster_sync();
#endif
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  float d[BN / 2];
  int cw = wg - 1;  // consumer: rows cw*64 .. of the tile
#if PERSISTENT
  int g = 0;
  for (int tile = first; tile < tiles; tile += step) {
  int m0 = TILE_M0(tile), n0 = (tile % tiles_n) * BN;
#endif
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
  for (int kt = 0; kt < kt_count; ++kt) {
#if PERSISTENT
    int s = g % STAGES, phase = (g / STAGES) & 1;
    ++g;
#else
    int s = kt % STAGES, phase = (kt / STAGES) & 1;
#endif
    mbar_wait(&full[s], phase);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < 4 * (MODE != 2 && MODE != 3); ++kk) {
      unsigned long long da = desc(sa + s * BM * 128 + cw * 64 * 128) + 2 * kk;
      unsigned long long db = desc(sb + s * BN * 128) + 2 * kk;
      WGMMA(d, da, db);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    if (tid == 0) RELEASE(&empty[s]);
  }
  int warp = tid / 32, lane = tid % 32;
  int r0 = m0 + cw * 64 + warp * 16 + lane / 4;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    int col = n0 + j * 8 + (lane % 4) * 2;
    float b0 = bias[col], b1 = bias[col + 1];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int r = r0 + h * 8;
      float x0 = d[4 * j + 2 * h] + b0, x1 = d[4 * j + 2 * h + 1] + b1;
      x0 = 0.5f * x0 * (1.0f + erff(x0 * 0.7071067811865476f));
      x1 = 0.5f * x1 * (1.0f + erff(x1 * 0.7071067811865476f));
      unsigned packed;
      asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(x1), "f"(x0));
      if (r < M && (MODE == 0 || MODE == 2 || x0 == 12345.0f)) c[((long long)r * N + col) / 2] = packed;
    }
  }
#if PERSISTENT
  }
#endif
#if CLUSTER
  cluster_sync();  // the peer may still multicast into this CTA's stages or arrive on its barriers
#endif
}
"""


#: label -> (BM, BN, stages, 2-CTA cluster multicasting B, persistent, mode: 0 the GEMM, 1 without its stores,
#: 2 without its MMAs, 3 neither: what the loads and the epilogue cost alone)
VARIANTS = {"128x256 s4": (128, 256, 4, 0, 0, 0), "128x256 s4 cluster2": (128, 256, 4, 1, 0, 0),
            "128x256 s4 persistent": (128, 256, 4, 0, 1, 0), "persistent cluster2": (128, 256, 4, 1, 1, 0),
            "persistent, no stores": (128, 256, 4, 0, 1, 1), "persistent, no MMAs": (128, 256, 4, 0, 1, 2),
            "persistent, loads only": (128, 256, 4, 0, 1, 3), "persistent cluster2, loads only": (128, 256, 4, 1, 1, 3),
            "persistent cluster2, no stores": (128, 256, 4, 1, 1, 1)}


def wgmma_macro(bn: int) -> str:
    """WGMMA(d, da, db): one m64n{bn}k16 fp16 wgmma accumulating into d[bn / 2] (fp32)."""
    n = bn // 2
    regs = ", ".join(f"%{i}" for i in range(n))
    operands = ", ".join(f'"+f"(d[{i}])' for i in range(n))
    return (f'#define WGMMA(d, da, db) asm volatile("{{\\n .reg .pred p;\\n setp.ne.b32 p, %{n + 2}, 0;\\n '
            f'wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.f16.f16 {{{regs}}}, %{n}, %{n + 1}, p, 1, 1, 0, 0;\\n}}" '
            f': {operands} : "l"(da), "l"(db), "r"(1))\n')


def compile_kernel(bm: int, bn: int, stages: int, cluster: int, persistent: int, mode: int):
    import cupy as cp
    from cupy.cuda import nvrtc

    src = (f"#define BM {bm}\n#define BN {bn}\n#define STAGES {stages}\n#define CLUSTER {cluster}\n"
           f"#define MODE {mode}\n#define PERSISTENT {persistent}\n" + wgmma_macro(bn) + SOURCE)
    prog = nvrtc.createProgram(src, "wgmma_gemm.cu", [], [])
    try:
        nvrtc.compileProgram(prog, ["-arch=sm_90a", "-std=c++17", "--ptxas-options=-v"])
    except Exception:
        print(nvrtc.getProgramLog(prog))
        raise
    print("ptxas:", " ".join(line.strip() for line in nvrtc.getProgramLog(prog).splitlines() if "registers" in line
                             or "spill" in line)[:300], flush=True)
    mod = cp.cuda.function.Module()
    mod.load(nvrtc.getCUBIN(prog))
    return mod, mod.get_function("gemm_gelu")


def tensor_map(lib, ptr: int, rows: int, k: int, box_rows: int):
    tm = (ctypes.c_uint64 * 16)()
    dims = (ctypes.c_uint64 * 2)(k, rows)
    strides = (ctypes.c_uint64 * 1)(k * 2)
    box = (ctypes.c_uint32 * 2)(64, box_rows)
    es = (ctypes.c_uint32 * 2)(1, 1)
    err = lib.cuTensorMapEncodeTiled(ctypes.byref(tm), 6, 2, ctypes.c_void_p(ptr), dims, strides, box, es, 0, 3, 3, 0)
    if err:
        raise RuntimeError(f"cuTensorMapEncodeTiled: {err}")
    return tm


def main() -> None:
    import torch
    from triton.testing import do_bench

    lib = ctypes.CDLL("libcuda.so.1")
    F = torch.nn.functional
    rows = []
    shapes = {"bert ffn1 b32": (4096, 768, 3072), "vit ffn1 b32": (6304, 768, 3072)}
    for name, (m, k, n) in shapes.items():
        if len(sys.argv) > 1 and sys.argv[1] not in name:
            continue
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) * k ** -0.5  # [N, K]: B^T, K-major
        b = torch.randn(n, device="cuda", dtype=torch.float32)
        ref = F.gelu(a.float() @ w.float().T + b)
        t_sep = do_bench(lambda: F.gelu(torch.addmm(b.half(), a, w.T)), rep=200)
        t_mm = do_bench(lambda: torch.addmm(b.half(), a, w.T), rep=200)
        best = None
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for label, (bm, bn, stages, cluster, persistent, mode) in VARIANTS.items():
            try:
                mod, fn = compile_kernel(bm, bn, stages, cluster, persistent, mode)
            except Exception as exc:
                print(f"{name} {label}: compile failed: {str(exc)[:300]}", flush=True)
                continue
            smem = stages * (bm + bn) * 128 + 2 * stages * 8 + 1024
            lib.cuFuncSetAttribute(ctypes.c_void_p(fn.ptr), 8, smem)
            c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
            ta = tensor_map(lib, a.data_ptr(), m, k, bm)
            tb = tensor_map(lib, w.data_ptr(), n, k, bn // 2 if cluster else bn)
            vals = [ta, tb, ctypes.c_uint64(b.data_ptr()), ctypes.c_uint64(c.data_ptr()), ctypes.c_int(m),
                    ctypes.c_int(n), ctypes.c_int(k)]
            params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
            grid = (n // bn, -(-m // bm) + (-(-m // bm) % 2 if cluster else 0), 1)
            if persistent:
                grid = (min(sms - sms % 2, grid[0] * grid[1]), 1, 1)

            def call():
                err = lib.cuLaunchKernel(ctypes.c_void_p(fn.ptr), *grid, 384, 1, 1, smem,
                                         ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), params, None)
                if err:
                    raise RuntimeError(f"cuLaunchKernel: {err}")
            try:
                call()
                torch.cuda.synchronize()
                err = float((c.float() - ref).abs().max())
                t = do_bench(call, rep=200)
            except Exception as exc:
                print(f"{name} {label}: failed: {str(exc)[:300]}", flush=True)
                continue
            tflops = 2 * m * n * k / t / 1e9
            print(f"{name} {label}: {t * 1e3:.1f} us, {tflops:.0f} TFLOP/s, max err {err:.2e}", flush=True)
            if not mode and err < 1e-2 and (best is None or t < best[0]):
                best = (t, label, err)
        rows.append((name, t_sep * 1e3, t_mm * 1e3, best))
    print(f"\n{'GEMM':<14} {'mm+gelu':>8} {'mm':>7} {'ours':>7} {'sep/ours':>8}  config")
    for name, sep, mm, best in rows:
        if best is None:
            print(f"{name:<14} {sep:>8.1f} {mm:>7.1f}  (no correct configuration)")
            continue
        print(f"{name:<14} {sep:>8.1f} {mm:>7.1f} {best[0] * 1e3:>7.1f} {sep / (best[0] * 1e3):>8.2f}  {best[1]}")


if __name__ == "__main__":
    main()
