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


_STRIDED_REDUCE = kernels.source("strided_reduce.cu")


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


_ARG_REDUCE = kernels.source("arg_reduce.cu")
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

_SOFTMAX = BLOCK_REDUCE + kernels.source("softmax.cu")


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


_LAYER_NORM = BLOCK_REDUCE + kernels.source("layer_norm.cu")


_ROW_NORM = BLOCK_REDUCE + kernels.source("row_norm.cu")

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
