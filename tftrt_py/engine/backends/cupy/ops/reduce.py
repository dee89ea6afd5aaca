"""Reduce (cupy ReductionKernels accumulating in float / int64, or our kernel over a strided run of axes),
ArgReduce, Softmax (one block per row of the softmax axis, any axis) and Normalization (one block per row of the
last axis, in one pass where rows are whole 16-byte vectors)."""
from __future__ import annotations

from typing import List

import numpy as np

from tftrt_py.engine.backends.cupy import _device, kernels
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, register
from tftrt_py.engine.backends.cupy.ops.pointwise import C_TYPE
from tftrt_py.engine.backends.cupy.ops.quant import FORMATS, QuantizeOp

__all__ = ["ReduceOp", "StridedReduceOp", "ArgReduceOp", "SoftmaxOp", "NormalizationOp", "softmax_kernel",
           "row_block", "BLOCK_REDUCE"]

_PREAMBLE = r"""
__device__ __forceinline__ float tt_max(float a, float b) { return (a != a || a > b) ? a : b; }
__device__ __forceinline__ float tt_min(float a, float b) { return (a != a || a < b) ? a : b; }
__device__ __forceinline__ long long tt_max(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ long long tt_min(long long a, long long b) { return a < b ? a : b; }
"""

_FLOAT_MAP = {"l1": "fabsf((float)x)", "sum_squares": "((float)x * (float)x)", "l2": "((float)x * (float)x)",
              "log_sum_exp": "expf((float)x)"}
_INT_MAP = {"l1": "llabs((long long)x)", "sum_squares": "((long long)x * (long long)x)",
            "l2": "((long long)x * (long long)x)"}
_REDUCE = {"max": "tt_max(a, b)", "min": "tt_min(a, b)", "prod": "a * b"}
_IDENTITY_F = {"max": "__int_as_float(0xff800000)", "min": "__int_as_float(0x7f800000)", "prod": "1"}
_IDENTITY_I = {"max": "(-9223372036854775807LL - 1)", "min": "9223372036854775807LL", "prod": "1"}


def _reduction(op: str, in_dtype: str, count: int):
    """(accumulator type, map of x, reduce of a and b, identity, final value of a) of `op`."""
    is_float = in_dtype in ("float16", "float32")
    rt = "float" if is_float else "long long"
    mapping = (_FLOAT_MAP if is_float else _INT_MAP).get(op, f"({rt})x")
    identity = (_IDENTITY_F if is_float else _IDENTITY_I).get(op, "0")
    post = {"mean": f"(a / ({rt}){count})", "l2": "sqrtf((float)a)", "log_sum": "logf((float)a)",
            "log_sum_exp": "logf((float)a)"}.get(op, "a")
    return rt, mapping, _REDUCE.get(op, "a + b"), identity, post


def reduce_kernel(op: str, in_dtype: str, out_dtype: str, count: int):
    """ReductionKernel computing `op` of x over the reduced axes (`count` elements per output)."""
    rt, mapping, reduce, identity, post = _reduction(op, in_dtype, count)
    if out_dtype == "float16":
        post = f"(float)({post})"
    return kernels.reduction(f"{in_dtype} x", f"{out_dtype} y", mapping, reduce, f"y = ({C_TYPE[out_dtype]})({post})",
                             identity, f"tt_reduce_{op}", rt, _PREAMBLE)


def _axes(spec: Spec):
    """(input shape after the layer's first transpose, the reduced axes in order)."""
    p = spec.params
    perm = p.get("first_perm")
    shape = spec.in_shapes[0] if perm is None else tuple(spec.in_shapes[0][i] for i in perm)
    return shape, tuple(sorted(a % len(shape) for a in p["axes"]))


class ReduceOp(Op):
    def __init__(self, spec: Spec):
        p = spec.params
        self.perm = p.get("first_perm")
        shape, self.axes = _axes(spec)
        self.keep = bool(p.get("keep_dims"))
        self.op = p["op"]
        count = int(np.prod([shape[a] for a in self.axes])) if self.axes else 1
        in_dtype, out_dtype = spec.in_dtypes[0], spec.out_dtypes[0]
        self.kernel = reduce_kernel(self.op, in_dtype, out_dtype, count)
        self.tactic = {"op": "reduction_kernel"}

    def run(self, rc, ins, outs):
        x = ins[0] if self.perm is None else ins[0].transpose(self.perm)
        self.kernel(x, out=outs[0], axis=self.axes, keepdims=self.keep)


_STRIDED_REDUCE = r"""
extern "C" __global__ void tt_strided_reduce(const T* __restrict__ in, TO* __restrict__ y, long long rows, int len,
                                             long long inner) {
  long long step = (long long)gridDim.x * blockDim.x;
  for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < rows; r += step) {
    const T* p = in + (r / inner) * len * inner + r % inner;
    float a = IDENTITY;
#pragma unroll 4
    for (int l = 0; l < len; ++l) { float x = ld(p[l * inner]); float b = MAP; a = REDUCE; }
    y[r] = st<TO>(POST);
  }
}
"""


class StridedReduceOp(Op):
    """A float Reduce over a run of axes with others after it (a global average pool of NHWC [N, H, W, C] over H
    and W, a mean over a sequence's tokens): x as [outer, len, inner], one thread per (outer, inner) reading its
    len values a row of inner apart, so neighbouring threads read neighbouring values. cupy's ReductionKernel
    gives such reductions a thread per output too, but reads them strided: ResNet-50's pool at batch 128 moved
    25.7 MB in 40 us on an H100 (0.64 TB/s)."""

    def __init__(self, spec: Spec):
        shape, axes = _axes(spec)
        self.len = int(np.prod([shape[a] for a in axes]))
        self.inner = int(np.prod(shape[axes[-1] + 1:]))
        self.rows = int(np.prod(shape)) // max(self.len, 1)
        _, mapping, reduce, identity, post = _reduction(spec.params["op"], spec.in_dtypes[0], self.len)
        head = (f"#define T {kernels.raw_type(spec.in_dtypes[0])}\n#define TO {kernels.raw_type(spec.out_dtypes[0])}\n"
                f"#define IDENTITY {identity}\n#define MAP ({mapping})\n#define REDUCE ({reduce})\n"
                f"#define POST ((float)({post}))\n")
        self.kernel = kernels.raw_kernel(_PREAMBLE + head + _STRIDED_REDUCE, "tt_strided_reduce")
        self.tactic = {"op": "strided_reduce_kernel"}

    @staticmethod
    def fits(spec: Spec) -> bool:
        """Float input and output, no transpose first, the reduced axes one run that is not the last."""
        shape, axes = _axes(spec)
        return (spec.params.get("first_perm") is None and bool(axes) and axes[-1] < len(shape) - 1
                and axes == tuple(range(axes[0], axes[-1] + 1))
                and {spec.in_dtypes[0], spec.out_dtypes[0]} <= {"float16", "float32"})

    def run(self, rc, ins, outs):
        if self.rows and self.len:
            kernels.launch(self.kernel, self.rows, (ins[0], outs[0], kernels.i64(self.rows), kernels.i32(self.len),
                                                    kernels.i64(self.inner)))


_ARG_REDUCE = r"""
extern "C" __global__ void tt_arg_reduce(const T* __restrict__ x, int* __restrict__ y, long long rows, int len,
                                         long long inner) {
  for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < rows; r += (long long)gridDim.x * blockDim.x) {
    const T* p = x + (r / inner) * len * inner + r % inner;
    V best = START;
    int at = 0;
    for (int l = 0; l < len; ++l) { V v = LOAD(p[l * inner]); if (v BETTER best) { best = v; at = l; } }
    y[r] = at;
  }
}
"""
#: per input dtype: (storage type, value type, load, lowest, highest)
_ARG_TYPES = {"float32": ("float", "float", "", "-3.402823466e38f", "3.402823466e38f"),
              "float16": ("unsigned short", "float", "ld", "-3.402823466e38f", "3.402823466e38f"),
              "int32": ("int", "int", "", "(-2147483647 - 1)", "2147483647"),
              "int64": ("long long", "long long", "", "(-9223372036854775807LL - 1)", "9223372036854775807LL")}


class ArgReduceOp(Op):
    """TF's ArgMax/ArgMin: one thread per output scans its row in order, keeping the first value beyond the
    best so far (from the dtype's lowest/highest), so NaN never wins and a row of NaN or -Inf gives 0."""

    def __init__(self, spec: Spec):
        shape = spec.in_shapes[0]
        axis = spec.params["axis"] % len(shape)
        self.len, self.inner = shape[axis], int(np.prod(shape[axis + 1:]))
        self.rows = int(np.prod(shape)) // max(self.len, 1)
        store, value, load, lowest, highest = _ARG_TYPES[spec.in_dtypes[0]]
        is_max = spec.params["op"] == "max"
        head = (f"#define T {store}\n#define V {value}\n#define LOAD(v) {load}(v)\n"
                f"#define START {lowest if is_max else highest}\n#define BETTER {'>' if is_max else '<'}\n")
        self.kernel = kernels.raw_kernel(head + _ARG_REDUCE, "tt_arg_reduce")
        self.tactic = {"op": "arg_reduce_kernel"}

    def run(self, rc, ins, outs):
        if self.len:
            kernels.launch(self.kernel, self.rows, (ins[0], outs[0], kernels.i64(self.rows), kernels.i32(self.len),
                                                    kernels.i64(self.inner)))


BLOCK_REDUCE = r"""
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

_SOFTMAX = BLOCK_REDUCE + r"""
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


_LAYER_NORM = BLOCK_REDUCE + r"""
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


_ROW_NORM = BLOCK_REDUCE + r"""
// Each row of LEN elements is read once into registers (ITEMS vectors of VEC elements, 16 bytes, per thread), its
// mean and variance taken from them, its output written once. WARP_ROWS: one warp per row (shuffle reductions
// only, blockDim.x / 32 rows per block); else one block per row.
union tt_vec { uint4 u; T e[VEC]; };
__device__ __forceinline__ float tt_row_sum(float v, float* shared) {
#if WARP_ROWS
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
#else
  return tt_block_reduce(v, false, shared);
#endif
}
extern "C" __global__ void tt_row_norm(const T* __restrict__ x, const T* __restrict__ r, const float* __restrict__ g,
                                       const float* __restrict__ b, T* __restrict__ y, float eps, long long rows
#if QUANT  // the output also quantized (tt_q with scale qs: quant.QuantizeOp's bytes), VEC bytes a vector
                                       , unsigned int* __restrict__ yq, float qs
#endif
                                       ) {
  __shared__ float shared[32];
#if WARP_ROWS
  long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  int t = threadIdx.x & 31, nt = 32;
  if (row >= rows) return;  // the whole warp
#else
  long long row = blockIdx.x;
  int t = threadIdx.x, nt = blockDim.x;
#endif
  long long base = row * LEN;
  float v[ITEMS][VEC];
  float s = 0.0f;
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    int c = (it * nt + t) * VEC;
    tt_vec a, o;
    a.u = o.u = make_uint4(0, 0, 0, 0);
    if (c < LEN) {
      a.u = *(const uint4*)(x + base + c);
      if (RESIDUAL) o.u = *(const uint4*)(r + base + c);
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) { v[it][e] = ld(a.e[e]) + (RESIDUAL ? ld(o.e[e]) : 0.0f); s += v[it][e]; }
  }
  float mean = tt_row_sum(s, shared) / LEN;
  float q = 0.0f;
#pragma unroll
  for (int it = 0; it < ITEMS; ++it)
    if ((it * nt + t) * VEC < LEN)
#pragma unroll
      for (int e = 0; e < VEC; ++e) { float d = v[it][e] - mean; q += d * d; }
  float rstd = rsqrtf(tt_row_sum(q, shared) / LEN + eps);
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    int c = (it * nt + t) * VEC;
    if (c >= LEN) continue;
    tt_vec out;
    float gc[VEC], bc[VEC];  // scale and bias as 16-byte loads (VEC is 4 or 8 floats)
#pragma unroll
    for (int e = 0; e < VEC; e += 4) {
      *(float4*)(gc + e) = *(const float4*)(g + c + e);
      *(float4*)(bc + e) = *(const float4*)(b + c + e);
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) out.e[e] = st<T>((v[it][e] - mean) * rstd * gc[e] + bc[e]);
    *(uint4*)(y + base + c) = out.u;
#if QUANT
    unsigned int words[VEC / 4];
#pragma unroll
    for (int w = 0; w < VEC / 4; ++w) {
      words[w] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) words[w] |= ((unsigned int)(tt_q(ld(out.e[4 * w + j]), qs) & 0xff)) << (8 * j);
    }
#if VEC == 8
    *(uint2*)(yq + (base + c) / 4) = make_uint2(words[0], words[1]);
#else
    yq[(base + c) / 4] = words[0];
#endif
#endif
  }
}
"""

#: most vectors one thread of the one-pass kernel keeps (longer rows take the three-pass kernel)
ROW_NORM_ITEMS = 8
#: rows of at most this many vectors go one per warp (4 warps a block)
WARP_ROW_VECTORS = 32 * 4


class NormalizationOp(Op):
    """Layer normalization over the last axis of x (+ residual): statistics in fp32, scale and bias fused. Rows
    of whole 16-byte vectors (and buffers aligned to them) take one pass: each element read once, kept in
    registers, written once (one warp per row up to WARP_ROW_VECTORS vectors, else one block); other rows three
    passes over memory. With ``dual_scale`` in ``spec.quant`` (INT8 and FP8 engines: quantized layers read the
    output) the output is also written quantized, as quant.QuantizeOp would quantize it: by the one-pass kernel as
    it writes the output, else by a quantize step after it."""

    def __init__(self, spec: Spec):
        cupy = _device.require()
        dual = (spec.quant or {}).get("dual_scale")
        fmt = FORMATS[spec.quant["format"]] if dual is not None else None
        shape = spec.in_shapes[0]
        self.len = shape[-1]
        self.rows = int(np.prod(shape[:-1]))
        self.residual = len(spec.in_shapes) > 1
        value = "(ld(x[i]) + ld(r[i]))" if self.residual else "ld(x[i])"
        head = f"#define T {kernels.raw_type(spec.cdt)}\n#define VALUE(i) {value}\n"
        self.kernel = kernels.raw_kernel(head + _LAYER_NORM, "tt_layer_norm")
        self.block = row_block(-(-self.len // 4))
        vec = 16 // np.dtype(spec.cdt).itemsize
        vectors = self.len // vec
        warp_rows = vectors <= WARP_ROW_VECTORS
        row_threads = 32 if warp_rows else min(512, -(-vectors // 32) * 32)
        items = -(-vectors // row_threads)
        self.one_pass = None
        if self.len % vec == 0 and items <= ROW_NORM_ITEMS:
            head = (f"#define T {kernels.raw_type(spec.cdt)}\n#define VEC {vec}\n#define LEN {self.len}\n"
                    f"#define ITEMS {items}\n#define RESIDUAL {int(self.residual)}\n"
                    f"#define WARP_ROWS {int(warp_rows)}\n#define QUANT {int(fmt is not None)}\n"
                    + (fmt.qfunc if fmt is not None else ""))
            grid, threads = (-(-self.rows // 4), 128) if warp_rows else (self.rows, row_threads)
            self.one_pass = (kernels.raw_kernel(head + _ROW_NORM, "tt_row_norm"), grid, threads)
        # weights rounded to the compute dtype, as the numpy backend's FP16 rounds them; applied in fp32
        self.scale, self.bias = (cupy.asarray(spec.weights[k].astype(spec.cdt).astype(np.float32))
                                 for k in ("scale", "bias"))
        self.eps = np.float32(spec.params["epsilon"])
        self.quant = None if fmt is None else (np.float32(dual), QuantizeOp(shape, spec.cdt, dual, self.len,
                                                                             qfunc=fmt.qfunc))
        self.device_bytes = int(self.scale.nbytes + self.bias.nbytes)
        self.tactic = ({"op": "layer_norm_one_pass", "block": self.one_pass[2]} if self.one_pass
                       else {"op": "layer_norm_kernel", "block": self.block})

    def run(self, rc, ins, outs):
        if not (self.rows and self.len):
            return
        r = ins[1] if self.residual else ins[0]
        args = (ins[0], r, self.scale, self.bias, outs[0])
        if self.one_pass and not any(a.data.ptr % 16 for a in (ins[0], r, *outs)):
            kernel, grid, threads = self.one_pass
            kernel((grid,), (threads,), (*args, self.eps, kernels.i64(self.rows), *outs[1:],
                                         *([self.quant[0]] if self.quant else [])))
            return
        self.kernel((self.rows,), (self.block,), (*args, kernels.i32(self.len), self.eps))
        if self.quant is not None:
            self.quant[1].run(rc, outs[:1], outs[1:])


@register("Normalization")
def normalization_candidates(spec: Spec) -> List[Op]:
    return [NormalizationOp(spec)]


@register("Reduce")
def reduce_candidates(spec: Spec) -> List[Op]:
    """cupy's reduction, and where it fits the strided kernel: timed, or the plan's recorded one."""
    cands = ([StridedReduceOp(spec)] if StridedReduceOp.fits(spec) else []) + [ReduceOp(spec)]
    want = (spec.prefer or {}).get("op")
    return [op for op in cands if op.tactic["op"] == want] or cands


@register("ArgReduce")
def argreduce_candidates(spec: Spec) -> List[Op]:
    return [ArgReduceOp(spec)]


@register("Softmax")
def softmax_candidates(spec: Spec) -> List[Op]:
    return [SoftmaxOp(spec)]
