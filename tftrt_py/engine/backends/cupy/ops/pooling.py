"""Pooling: one generated kernel per configuration, one thread per output element (sixteen int8 or E4M3
channels, or four where sixteen do not divide them, or eight fp16 ones, in a max pool), channels last
(consecutive threads read consecutive channels); 32-bit indices where the tensors allow. Up to three spatial
dims."""
from __future__ import annotations

from typing import List

import numpy as np

from tftrt_py.engine.backends.cupy import _device, kernels
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, pad3, register

__all__ = ["PoolOp"]

#: How a window is reduced: the accumulator, its start, taking one element, and the stored result.
_FLOAT = r"""
typedef float A;
#define INIT (IS_MAX ? -3.402823466e38f : 0.0f)  // TF's max pooling: NaN skipped, never below float's lowest
__device__ __forceinline__ void take(A& acc, T v) {
  float f = ld(v);
  if (IS_MAX) { if (f > acc) acc = f; } else { acc += f; }
}
__device__ __forceinline__ T finish(A acc, bool padded, int count) {
  if (IS_MAX && INCLUDE_PAD && padded && acc < 0.0f) acc = 0.0f;  // padding as zeros (a folded zero Padding)
  if (!IS_MAX) acc = INCLUDE_PAD ? acc / (float)(K0 * K1 * K2) : acc / (float)count;
  return st<T>(acc);
}
"""
#: Max pooling of int8 values four channels a word: the word's start, taking one, and the stored word.
_INT8_WORD = r"""
#define WORD_INIT ((int)0x80808080)  // -128 in each byte
__device__ __forceinline__ int take_word(int acc, int v) { return __vmaxs4(acc, v); }
__device__ __forceinline__ int finish_word(int acc, bool padded) {
  return INCLUDE_PAD && padded ? __vmaxs4(acc, 0) : acc;
}
"""
#: Max pooling of E4M3 bytes (stored as uint8) as fp16 pairs (sm_89 and later), four or sixteen channels a thread
#: (T int or int4): each pair of bytes converted to two fp16 values (exactly, one instruction), their max taken by
#: max.f16x2 (which returns the other value where one is NaN: NaN skipped, as the float kernel skips it), converted
#: back (exactly; a window of NaN alone keeps the start, -inf, which saturates to -448: TF's float lowest, saturated
#: as the quantize step saturates). ResNet-50's E4M3 max pool at batch 128 on an H200: 0.048 ms, against 0.069 with
#: the bytes mapped to ordered int8 values (byte-wise compares and maxima, which the GPU emulates).
_E4M3_HALVES = r"""
#define WORDS ((int)(sizeof(T) / 4))
struct A { unsigned h[2 * WORDS]; };
__device__ __forceinline__ unsigned hmax2(unsigned a, unsigned b) {
  unsigned d; asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d;
}
__device__ __forceinline__ unsigned halves(unsigned pair) {
  unsigned d; asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"((unsigned short)pair)); return d;
}
__device__ __forceinline__ unsigned e4m3_pair(unsigned h) {
  unsigned short d; asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(d) : "r"(h)); return d;
}
__device__ __forceinline__ A start() {
  A a;
#pragma unroll
  for (int k = 0; k < 2 * WORDS; ++k) a.h[k] = 0xfc00fc00u;  // -inf
  return a;
}
#define INIT start()
__device__ __forceinline__ void take(A& acc, T v) {
  const unsigned* w = reinterpret_cast<const unsigned*>(&v);
#pragma unroll
  for (int k = 0; k < WORDS; ++k) {
    acc.h[2 * k] = hmax2(acc.h[2 * k], halves(w[k] & 0xffff));
    acc.h[2 * k + 1] = hmax2(acc.h[2 * k + 1], halves(w[k] >> 16));
  }
}
__device__ __forceinline__ T finish(A acc, bool padded, int count) {
  if (INCLUDE_PAD && padded) take(acc, T{});
  T out;
  unsigned* w = reinterpret_cast<unsigned*>(&out);
#pragma unroll
  for (int k = 0; k < WORDS; ++k) w[k] = e4m3_pair(acc.h[2 * k]) | (e4m3_pair(acc.h[2 * k + 1]) << 16);
  return out;
}
"""
#: A thread's channels as one word (T int: four bytes) or four (T int4: sixteen, one 16-byte load a window element:
#: ResNet-50's int8 max pool at batch 128 on an H200 is bound by its load instructions).
_ONE_WORD = r"""
typedef int A;
#define INIT WORD_INIT
__device__ __forceinline__ void take(A& acc, T v) { acc = take_word(acc, v); }
__device__ __forceinline__ T finish(A acc, bool padded, int count) { return finish_word(acc, padded); }
"""
_FOUR_WORDS = r"""
typedef int4 A;
#define INIT make_int4(WORD_INIT, WORD_INIT, WORD_INIT, WORD_INIT)
__device__ __forceinline__ void take(A& acc, T v) {
  acc.x = take_word(acc.x, v.x); acc.y = take_word(acc.y, v.y); acc.z = take_word(acc.z, v.z);
  acc.w = take_word(acc.w, v.w);
}
__device__ __forceinline__ T finish(A acc, bool padded, int count) {
  return make_int4(finish_word(acc.x, padded), finish_word(acc.y, padded), finish_word(acc.z, padded),
                   finish_word(acc.w, padded));
}
"""
#: Max pooling of fp16 values eight channels at a time (T uint4: 16 bytes; C counts them) by max.f16x2, which
#: returns the other value where one is NaN: NaN is skipped as the float kernel skips it (sm_80 and later).
_HALFX8_MAX = r"""
typedef uint4 A;
#define INIT A{0xfc00fc00u, 0xfc00fc00u, 0xfc00fc00u, 0xfc00fc00u}  // -inf, as float's lowest rounds
__device__ __forceinline__ unsigned hmax2(unsigned a, unsigned b) {
  unsigned d; asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d;
}
__device__ __forceinline__ void take(A& acc, T v) {
  acc.x = hmax2(acc.x, v.x); acc.y = hmax2(acc.y, v.y); acc.z = hmax2(acc.z, v.z); acc.w = hmax2(acc.w, v.w);
}
__device__ __forceinline__ T finish(A acc, bool padded, int count) {
  if (INCLUDE_PAD && padded) take(acc, T{0u, 0u, 0u, 0u});
  return acc;
}
"""
#: in dtype of a max pool -> its policies (storage type, channels of one thread), widest first
_PACKED_MAX = {"int8": ((_INT8_WORD + _FOUR_WORDS, "int4", 16), (_INT8_WORD + _ONE_WORD, "int", 4)),
               "uint8": ((_E4M3_HALVES, "int4", 16), (_E4M3_HALVES, "int", 4)),
               "float16": ((_HALFX8_MAX, "uint4", 8),)}
_POOL = kernels.source("pool.cu")


class PoolOp(Op):
    def __init__(self, spec: Spec):
        p = spec.params
        shape, out = spec.in_shapes[0], spec.out_shapes[0]
        dtype = spec.in_dtypes[0]
        packed = [(policy, storage, lanes) for policy, storage, lanes in _PACKED_MAX.get(dtype, ())
                  if p["type"] == "max" and shape[-1] % lanes == 0 and (dtype != "float16" or _has_f16x2_max())]
        policy, storage, lanes = packed[0] if packed else (_FLOAT, kernels.raw_type(dtype), 1)
        small = max(int(np.prod(shape)), int(np.prod(out))) // lanes < 2 ** 30  # (a grid's stride past the end too)
        defs = {"T": storage, "C": shape[-1] // lanes, "IDX": "int" if small else "long long",
                "IS_MAX": int(p["type"] == "max"), "INCLUDE_PAD": int(bool(p.get("count_include_pad", False)))}
        s, k, o = pad3(shape[1:-1], 1), pad3(p["window"], 1), pad3(out[1:-1], 1)
        st, pd = pad3(p["strides"], 1), pad3(p["pre_padding"], 0)
        for d in range(3):
            defs.update({f"S{d}": s[d], f"K{d}": k[d], f"O{d}": o[d], f"ST{d}": st[d], f"PD{d}": pd[d]})
        head = "".join(f"#define {name} {value}\n" for name, value in defs.items())
        self.kernel = kernels.raw_kernel(head + policy + _POOL, "tt_pool")
        self.total = int(np.prod(out)) // lanes
        self.index = kernels.i32 if small else kernels.i64
        self.tactic = {"op": "pool_kernel"}

    def run(self, rc, ins, outs):
        kernels.launch(self.kernel, self.total, (ins[0], outs[0], self.index(self.total)))


def _has_f16x2_max() -> bool:
    """max.f16x2 needs sm_80."""
    return int(_device.require().cuda.Device().compute_capability) >= 80


@register("Pooling")
def pool_candidates(spec: Spec) -> List[Op]:
    return [PoolOp(spec)]
