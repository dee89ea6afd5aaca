"""Pooling: one generated kernel per configuration, one thread per output element (four int8 or E4M3 channels
in a max pool), channels last (consecutive threads read consecutive channels). Up to three spatial dims."""
from __future__ import annotations

from typing import List

import numpy as np

from tftrt_py.engine.backends.cupy import kernels
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
#: Max pooling of int8 values four channels at a time (T int: one word holds four; C counts words).
_INT8X4_MAX = r"""
typedef int A;
#define INIT ((int)0x80808080)  // -128 in each byte
__device__ __forceinline__ void take(A& acc, T v) { acc = __vmaxs4(acc, v); }
__device__ __forceinline__ T finish(A acc, bool padded, int count) {
  return INCLUDE_PAD && padded ? __vmaxs4(acc, 0) : acc;
}
"""
#: Max pooling of E4M3 bytes (stored as uint8) four channels at a time: each byte's sign and magnitude mapped to
#: an ordered signed byte (negative magnitudes reversed; an involution), the max taken as int8, mapped back. NaN
#: (+NaN ordered highest, -NaN lowest) is skipped, as the float kernel skips it.
_E4M3X4_MAX = r"""
typedef int A;
#define INIT ((int)0x80808080)  // below every ordered byte but -NaN's
__device__ __forceinline__ int ordered(int v) { return v ^ (__vcmplts4(v, 0) & 0x7f7f7f7f); }
__device__ __forceinline__ void take(A& acc, T v) {
  int o = ordered(v);
  int nan = __vcmpeq4(o, 0x7f7f7f7f);
  acc = __vmaxs4(acc, (o & ~nan) | (INIT & nan));
}
__device__ __forceinline__ T finish(A acc, bool padded, int count) {
  return ordered(INCLUDE_PAD && padded ? __vmaxs4(acc, 0) : acc);
}
"""
#: in dtype of a max pool over quantized bytes -> its policy (four channels a word)
_PACKED_MAX = {"int8": _INT8X4_MAX, "uint8": _E4M3X4_MAX}
_POOL = r"""
extern "C" __global__ void tt_pool(const T* __restrict__ x, T* __restrict__ y, long long total) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    long long r = i;
    int c = r % C; r /= C;
    int o2 = r % O2; r /= O2; int o1 = r % O1; r /= O1; int o0 = r % O0; long long n = r / O0;
    A acc = INIT;
    int count = 0;
    bool padded = false;  // the window reaches into the padding
    for (int k0 = 0; k0 < K0; ++k0) {
      int s0 = o0 * ST0 + k0 - PD0;
      if (s0 < 0 || s0 >= S0) { padded = true; continue; }
      for (int k1 = 0; k1 < K1; ++k1) {
        int s1 = o1 * ST1 + k1 - PD1;
        if (s1 < 0 || s1 >= S1) { padded = true; continue; }
        for (int k2 = 0; k2 < K2; ++k2) {
          int s2 = o2 * ST2 + k2 - PD2;
          if (s2 < 0 || s2 >= S2) { padded = true; continue; }
          take(acc, x[(((n * S0 + s0) * S1 + s1) * S2 + s2) * C + c]);
          ++count;
        }
      }
    }
    y[i] = finish(acc, padded, count);
  }
}
"""


class PoolOp(Op):
    def __init__(self, spec: Spec):
        p = spec.params
        shape, out = spec.in_shapes[0], spec.out_shapes[0]
        dtype = spec.in_dtypes[0]
        packed = dtype in _PACKED_MAX and p["type"] == "max" and shape[-1] % 4 == 0  # four bytes a word
        defs = {"T": "int" if packed else kernels.raw_type(dtype), "C": shape[-1] // 4 if packed else shape[-1],
                "IS_MAX": int(p["type"] == "max"), "INCLUDE_PAD": int(bool(p.get("count_include_pad", False)))}
        s, k, o = pad3(shape[1:-1], 1), pad3(p["window"], 1), pad3(out[1:-1], 1)
        st, pd = pad3(p["strides"], 1), pad3(p["pre_padding"], 0)
        for d in range(3):
            defs.update({f"S{d}": s[d], f"K{d}": k[d], f"O{d}": o[d], f"ST{d}": st[d], f"PD{d}": pd[d]})
        head = "".join(f"#define {name} {value}\n" for name, value in defs.items())
        self.kernel = kernels.raw_kernel(head + (_PACKED_MAX[dtype] if packed else _FLOAT) + _POOL, "tt_pool")
        self.total = int(np.prod(out)) // (4 if packed else 1)
        self.tactic = {"op": "pool_kernel"}

    def run(self, rc, ins, outs):
        kernels.launch(self.kernel, self.total, (ins[0], outs[0], kernels.i64(self.total)))


@register("Pooling")
def pool_candidates(spec: Spec) -> List[Op]:
    return [PoolOp(spec)]
