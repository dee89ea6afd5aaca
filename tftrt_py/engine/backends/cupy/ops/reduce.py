"""Reduce (cupy ReductionKernels accumulating in float / int64), ArgReduce, Softmax (one block per row of
the softmax axis, any axis) and Normalization (one block per row of the last axis)."""
from __future__ import annotations

from typing import List

import numpy as np

from tftrt_py.engine.backends.cupy import _device, kernels
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, align, register
from tftrt_py.engine.backends.cupy.ops.pointwise import C_TYPE

__all__ = ["ReduceOp", "ArgReduceOp", "SoftmaxOp", "NormalizationOp", "softmax_kernel", "row_block"]

_PREAMBLE = r"""
__device__ __forceinline__ float tt_max(float a, float b) { return (a != a || a > b) ? a : b; }
__device__ __forceinline__ float tt_min(float a, float b) { return (a != a || a < b) ? a : b; }
__device__ __forceinline__ long long tt_max(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ long long tt_min(long long a, long long b) { return a < b ? a : b; }
"""

_FLOAT_MAP = {"l1": "fabsf((float)x)", "sum_squares": "((float)x * (float)x)", "l2": "((float)x * (float)x)"}
_INT_MAP = {"l1": "llabs((long long)x)", "sum_squares": "((long long)x * (long long)x)",
            "l2": "((long long)x * (long long)x)"}
_REDUCE = {"max": "tt_max(a, b)", "min": "tt_min(a, b)", "prod": "a * b"}
_IDENTITY_F = {"max": "__int_as_float(0xff800000)", "min": "__int_as_float(0x7f800000)", "prod": "1"}
_IDENTITY_I = {"max": "(-9223372036854775807LL - 1)", "min": "9223372036854775807LL", "prod": "1"}


def reduce_kernel(op: str, in_dtype: str, out_dtype: str, count: int):
    """ReductionKernel computing `op` of x over the reduced axes (`count` elements per output)."""
    is_float = in_dtype in ("float16", "float32")
    rt = "float" if is_float else "long long"
    mapping = (_FLOAT_MAP if is_float else _INT_MAP).get(op, f"({rt})x")
    reduce = _REDUCE.get(op, "a + b")
    identity = (_IDENTITY_F if is_float else _IDENTITY_I).get(op, "0")
    post = {"mean": f"(a / ({rt}){count})", "l2": "sqrtf((float)a)", "log_sum": "logf((float)a)"}.get(op, "a")
    if out_dtype == "float16":
        post = f"(float)({post})"
    return kernels.reduction(f"{in_dtype} x", f"{out_dtype} y", mapping, reduce, f"y = ({C_TYPE[out_dtype]})({post})",
                             identity, f"tt_reduce_{op}", rt, _PREAMBLE)


class ReduceOp(Op):
    def __init__(self, spec: Spec):
        p = spec.params
        self.perm = p.get("first_perm")
        shape = spec.in_shapes[0] if self.perm is None else tuple(spec.in_shapes[0][i] for i in self.perm)
        rank = len(shape)
        self.axes = tuple(sorted(a % rank for a in p["axes"]))
        self.keep = bool(p.get("keep_dims"))
        self.op = p["op"]
        count = int(np.prod([shape[a] for a in self.axes])) if self.axes else 1
        in_dtype, out_dtype = spec.in_dtypes[0], spec.out_dtypes[0]
        self.keep_shape = tuple(1 if i in self.axes else d for i, d in enumerate(shape))
        if self.op == "log_sum_exp":
            self.kmax = reduce_kernel("max", in_dtype, "float32", count)
            self.ksum = kernels.reduction(f"{in_dtype} x, float32 m", "float32 y",
                                          "expf((float)x - (isfinite(m) ? m : 0.0f))", "a + b", "y = a", "0",
                                          "tt_sum_exp", "float")
            self.kfin = kernels.elementwise("float32 s, float32 m", f"{out_dtype} y",
                                            f"y = ({C_TYPE[out_dtype]})(logf(s) + (isfinite(m) ? m : 0.0f))",
                                            "tt_log_sum_exp")
            self.half = align(int(np.prod(self.keep_shape)) * 4)
            self.workspace = 2 * self.half
        else:
            self.kernel = reduce_kernel(self.op, in_dtype, out_dtype, count)
        self.tactic = {"op": "reduction_kernel"}

    def run(self, rc, ins, outs):
        x = ins[0] if self.perm is None else ins[0].transpose(self.perm)
        if self.op != "log_sum_exp":
            self.kernel(x, out=outs[0], axis=self.axes, keepdims=self.keep)
            return
        m = rc.scratch(0, self.keep_shape, "float32")
        s = rc.scratch(self.half, self.keep_shape, "float32")
        self.kmax(x, out=m, axis=self.axes, keepdims=True)
        self.ksum(x, m, out=s, axis=self.axes, keepdims=True)
        self.kfin(s, m, outs[0].reshape(self.keep_shape))


class ArgReduceOp(Op):
    def __init__(self, spec: Spec):
        self.axis = spec.params["axis"] % len(spec.in_shapes[0])
        self.fn = "argmax" if spec.params["op"] == "max" else "argmin"
        self.tactic = {"op": "cupy_" + self.fn}

    def run(self, rc, ins, outs):
        cupy = _device.require()
        cupy.copyto(outs[0], getattr(cupy, self.fn)(ins[0], axis=self.axis), casting="unsafe")


_BLOCK_REDUCE = r"""
__device__ __forceinline__ float tt_block_reduce(float v, bool is_max, float* shared) {
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffff, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = shared[0];
  for (int i = 1; i < nwarps; ++i) v = is_max ? fmaxf(v, shared[i]) : v + shared[i];
  return v;
}
"""

_SOFTMAX = _BLOCK_REDUCE + r"""
extern "C" __global__ void tt_softmax(const TI* __restrict__ x, TO* __restrict__ y, int len, long long inner) {
  __shared__ float shared[32];
  long long row = blockIdx.x;
  long long base = (row / inner) * len * inner + row % inner;
  float m = -TT_INF;
  for (int l = threadIdx.x; l < len; l += blockDim.x) m = fmaxf(m, ld(x[base + l * inner]));
  m = tt_block_reduce(m, true, shared);
  float s = 0.0f;
  for (int l = threadIdx.x; l < len; l += blockDim.x) s += expf(ld(x[base + l * inner]) - m);
  s = tt_block_reduce(s, false, shared);
  for (int l = threadIdx.x; l < len; l += blockDim.x) y[base + l * inner] = st<TO>(expf(ld(x[base + l * inner]) - m) / s);
}
"""


def row_block(length: int) -> int:
    """Threads of the block that reduces one row of `length` elements."""
    return int(min(1024, max(32, 1 << int(np.ceil(np.log2(max(length, 1)))))))


def softmax_kernel(in_dtype: str, out_dtype: str):
    """tt_softmax(x, y, len, inner): one block per row of `len` elements `inner` apart; fp32 math."""
    head = f"#define TI {kernels.raw_type(in_dtype)}\n#define TO {kernels.raw_type(out_dtype)}\n"
    return kernels.raw_kernel(head + _SOFTMAX, "tt_softmax")


class SoftmaxOp(Op):
    def __init__(self, spec: Spec):
        shape = spec.in_shapes[0]
        axis = spec.params["axis"] % len(shape)
        self.len = shape[axis]
        self.inner = int(np.prod(shape[axis + 1:]))
        self.rows = int(np.prod(shape)) // max(self.len, 1)
        self.block = row_block(self.len)
        self.kernel = softmax_kernel(spec.in_dtypes[0], spec.out_dtypes[0])
        self.tactic = {"op": "softmax_kernel", "block": self.block}

    def run(self, rc, ins, outs):
        if self.rows and self.len:
            self.kernel((self.rows,), (self.block,), (ins[0], outs[0], kernels.i32(self.len), kernels.i64(self.inner)))


_LAYER_NORM = _BLOCK_REDUCE + r"""
extern "C" __global__ void tt_layer_norm(const T* __restrict__ x, const T* __restrict__ r, const float* __restrict__ g,
                                         const float* __restrict__ b, T* __restrict__ y, int len, float eps) {
  __shared__ float shared[32];
  long long base = (long long)blockIdx.x * len;
  float s = 0.0f;
  for (int l = threadIdx.x; l < len; l += blockDim.x) s += VALUE(base + l);
  float mean = tt_block_reduce(s, false, shared) / len;
  float q = 0.0f;
  for (int l = threadIdx.x; l < len; l += blockDim.x) { float d = VALUE(base + l) - mean; q += d * d; }
  float rstd = rsqrtf(tt_block_reduce(q, false, shared) / len + eps);
  for (int l = threadIdx.x; l < len; l += blockDim.x) y[base + l] = st<T>((VALUE(base + l) - mean) * rstd * g[l] + b[l]);
}
"""


class NormalizationOp(Op):
    """Layer normalization over the last axis of x (+ residual): statistics in fp32, scale and bias fused."""

    def __init__(self, spec: Spec):
        cupy = _device.require()
        shape = spec.in_shapes[0]
        self.len = shape[-1]
        self.rows = int(np.prod(shape[:-1]))
        self.block = row_block(-(-self.len // 4))
        self.residual = len(spec.in_shapes) > 1
        value = "(ld(x[i]) + ld(r[i]))" if self.residual else "ld(x[i])"
        head = f"#define T {kernels.raw_type(spec.cdt)}\n#define VALUE(i) {value}\n"
        self.kernel = kernels.raw_kernel(head + _LAYER_NORM, "tt_layer_norm")
        # weights rounded to the compute dtype, as the numpy backend's FP16 rounds them; applied in fp32
        self.scale, self.bias = (cupy.asarray(spec.weights[k].astype(spec.cdt).astype(np.float32))
                                 for k in ("scale", "bias"))
        self.eps = np.float32(spec.params["epsilon"])
        self.device_bytes = int(self.scale.nbytes + self.bias.nbytes)
        self.tactic = {"op": "layer_norm_kernel", "block": self.block}

    def run(self, rc, ins, outs):
        if self.rows and self.len:
            r = ins[1] if self.residual else ins[0]
            self.kernel((self.rows,), (self.block,), (ins[0], r, self.scale, self.bias, outs[0],
                                                      kernels.i32(self.len), self.eps))


@register("Normalization")
def normalization_candidates(spec: Spec) -> List[Op]:
    return [NormalizationOp(spec)]


@register("Reduce")
def reduce_candidates(spec: Spec) -> List[Op]:
    return [ReduceOp(spec)]


@register("ArgReduce")
def argreduce_candidates(spec: Spec) -> List[Op]:
    return [ArgReduceOp(spec)]


@register("Softmax")
def softmax_candidates(spec: Spec) -> List[Op]:
    return [SoftmaxOp(spec)]
