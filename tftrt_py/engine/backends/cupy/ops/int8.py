"""INT8 Convolution and MatrixMultiply: int8 x int8 products accumulated in int32 (cuDNN int8 graphs,
cuBLAS or cuBLASLt int8 GEMMs with both operands K-contiguous), dequantized, biased, summed and activated in fp32.

The contract (numpy_precision.py computes the same on the CPU): an activation operand is quantized
with its tensor's symmetric scale s_x = dynamic_range / 127, ``q = clamp(rint(x / s_x), -127, 127)``
(round half to even); a constant operand (weights) per output channel, s_w[c] = max|w[..., c]| / 127
(a scale of 0 counts as 1); ``y = act(acc * s_x * s_w[c] + bias + residual)`` in fp32, rounded to fp16
(also before an int8 output is requantized).

Quantizing is a step of its own (:class:`QuantizeOp`, shared by every int8 reader of a tensor, with
channels zero-padded to a multiple of 16); a tensor that only int8 layers read is written as int8
directly by its int8 producer (``out_scale``), so it never exists in float; a convolution output that
int8 layers and others (a residual sum) read is written twice by its producer, in fp16 and as int8
(``dual_scale``).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable, List, Optional, Tuple

import numpy as np

from tftrt_py.engine.backends.cupy import _device, kernels
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, align
from tftrt_py.engine.backends.cupy.ops.conv import (CudnnConvGraph, ConvGeom, _cudnn_activation, cudnn_graph_cache,
                                                    im2col_kernel, nhwc_dims)
from tftrt_py.engine.backends.cupy.ops.pointwise import C_TYPE, PREAMBLE, activation_expr

__all__ = ["QMAX", "PAD", "INT8", "QuantFormat", "conv_channels", "tensor_scale", "quantize_weights", "QuantizeOp",
           "int8_conv_candidates", "int8_matmul_candidates", "matmul_dequant", "padded"]

logger = logging.getLogger(__name__)

QMAX = 127
#: Quantized operands have their reduction (channel) dim zero-padded to a multiple of this.
PAD = 16


def padded(n: int, to: int = PAD) -> int:
    return -(-int(n) // to) * to


def conv_channels(c: int) -> int:
    """Channels of a convolution's quantized input: a multiple of 16, or of 4 below 16 (an RGB image
    becomes 4 channels: 4 bytes a pixel, which the GEMM path's im2col moves as one word)."""
    return padded(c, 4) if c < PAD else padded(c)


def tensor_scale(dynamic_range: float, qmax: float = QMAX) -> np.float32:
    """The symmetric per-tensor scale of a tensor with this dynamic range (1 for an empty range); `qmax`: the
    largest quantized magnitude (448 for FP8)."""
    amax = float(dynamic_range)
    return np.float32(amax / qmax if amax > 0 and np.isfinite(amax) else 1.0)


def quantize_weights(w: np.ndarray, axis: int = -1) -> Tuple[np.ndarray, np.ndarray]:
    """(int8 weights, float32 scale per index of `axis`): s = max|w| over the other axes / 127 (1 where
    that is 0), computed in float64."""
    w = np.asarray(w, np.float64)
    axis = axis % w.ndim
    amax = np.max(np.abs(w), axis=tuple(a for a in range(w.ndim) if a != axis), keepdims=True)
    scale = np.where(amax > 0, amax / QMAX, 1.0)
    q = np.clip(np.rint(w / scale), -QMAX, QMAX)
    return q.astype(np.int8), scale.reshape(-1).astype(np.float32)


# -- quantize step -----------------------------------------------------------------------------------
#: tt_q(v, s): the quantized byte of v with scale s (in the low 8 bits); tt_v(q): the value of byte q (before
#: its scale). fp8.py has the E4M3 ones. The int8 one clamps, then rounds to nearest even by adding 1.5 * 2**23 (the
#: sum's low bits are the integer): rintf and the float-to-int conversion run at a quarter of the rate of adds, and
#: a quantize step is bound by its instructions (a [4096, 768] fp16 tensor: 5.3 us, FP8's step 4.0).
INT8_Q = r"""
__device__ __forceinline__ int tt_q(float v, float s) {
  if (!(s > 0.0f)) return 0;
  return __float_as_int(fminf(fmaxf(v / s, -127.0f), 127.0f) + 12582912.0f) - 0x4B400000;
}
__device__ __forceinline__ float tt_v(int q) { return (float)(signed char)q; }
"""


@dataclasses.dataclass(frozen=True)
class QuantFormat:
    """How a quantized precision stores its operands here: storage dtype, largest magnitude (a tensor's range
    maps to it), the device functions tt_q/tt_v that round to and read its bytes, the padding of a convolution's
    input channels."""

    name: str
    storage: str
    qmax: float
    qfunc: str
    channels: Callable[[int], int]

    def scale(self, dynamic_range: float) -> np.float32:
        return tensor_scale(dynamic_range, self.qmax)


INT8 = QuantFormat("INT8", "int8", QMAX, INT8_Q, conv_channels)
_QUANTIZE = r"""
extern "C" __global__ void tt_quantize(const T* __restrict__ x, int* __restrict__ q, float s, long long groups) {
  // one thread per 4 output bytes (VEC8: 8): q is [OUTER, D1, D2P] (D2P % 4 == 0) read from x [OUTER, D2, D1]
  // (TRANSPOSE) or x [OUTER, D1, D2]; padding bytes are 0.
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < groups;
       i += (long long)gridDim.x * blockDim.x) {
#if VEC8  // fp16, no padding, no transpose, 8 | D2: eight halves in one 16-byte load, two words stored
    uint4 h = reinterpret_cast<const uint4*>(x)[i];
    unsigned int hw[4] = {h.x, h.y, h.z, h.w}, words[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      unsigned short b = (unsigned short)((hw[j / 2] >> (16 * (j % 2))) & 0xffff);
      words[j / 4] |= ((unsigned int)(tt_q(ld(b), s) & 0xff)) << (8 * (j % 4));
    }
    reinterpret_cast<uint2*>(q)[i] = make_uint2(words[0], words[1]);
#else
    unsigned int word = 0;
#if VEC4  // fp16, no padding, no transpose: four consecutive halves in one 8-byte load
    uint2 h = reinterpret_cast<const uint2*>(x)[i];
    unsigned short hs[4] = {(unsigned short)(h.x & 0xffff), (unsigned short)(h.x >> 16),
                            (unsigned short)(h.y & 0xffff), (unsigned short)(h.y >> 16)};
#pragma unroll
    for (int j = 0; j < 4; ++j) word |= ((unsigned int)(tt_q(ld(hs[j]), s) & 0xff)) << (8 * j);
#else
    long long e = i * 4;
    int c0 = e % D2P; long long r = e / D2P;
    int d1 = r % D1; long long o = r / D1;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int c = c0 + j;
      int v = 0;
      if (c < D2) v = tt_q(ld(TRANSPOSE ? x[(o * D2 + c) * D1 + d1] : x[(o * D1 + d1) * D2 + c]), s);
      word |= ((unsigned int)(v & 0xff)) << (8 * j);
    }
#endif
    q[i] = (int)word;
#endif
  }
}
"""


def _vector(dtype: str, d2: int, d2p: int, transpose: bool) -> int:
    """Halves a thread of the quantize kernel reads in one load where fp16 rows are read as they are (8 or 4), else 1
    (element by element, 4 a thread)."""
    if dtype != "float16" or transpose or d2 != d2p:
        return 1
    return 8 if d2 % 8 == 0 else 4


def quantize_kernel(dtype: str, outer: int, d1: int, d2: int, d2p: int, transpose: bool, qfunc: str = INT8_Q):
    vec = _vector(dtype, d2, d2p, transpose)
    head = (f"#define T {kernels.raw_type(dtype)}\n#define D1 {d1}\n#define D2 {d2}\n#define D2P {d2p}\n"
            f"#define TRANSPOSE {int(transpose)}\n#define VEC4 {int(vec == 4)}\n#define VEC8 {int(vec == 8)}\n")
    return kernels.raw_kernel(head + qfunc + _QUANTIZE, "tt_quantize")


class QuantizeOp(Op):
    """x (float) -> int8 with scale `s`; the last dim zero-padded to `last_padded`; with `transpose` the
    last two dims are swapped first (a [.., K, N] operand becomes K-contiguous [.., N, K]). `qfunc`: the
    rounding (int8, or fp8.E4M3_Q: E4M3 bytes)."""

    def __init__(self, shape, dtype: str, scale: float, last_padded: int, transpose: bool = False,
                 qfunc: str = INT8_Q):
        shape = tuple(int(d) for d in shape)
        if transpose:
            d2, d1 = shape[-2], shape[-1]
            outer = int(np.prod(shape[:-2], dtype=np.int64))
        else:
            d1, d2 = (shape[-2] if len(shape) > 1 else 1), shape[-1]
            outer = int(np.prod(shape[:-2], dtype=np.int64)) if len(shape) > 1 else 1
        self.scale = np.float32(scale)
        self.groups = outer * d1 * last_padded // max(4, _vector(dtype, d2, last_padded, transpose))
        self.kernel = quantize_kernel(dtype, outer, d1, d2, last_padded, transpose, qfunc)
        self.tactic = {"op": "quantize", "scale": float(self.scale), "transpose": bool(transpose)}

    def run(self, rc, ins, outs):
        kernels.launch(self.kernel, self.groups, (ins[0], outs[0], self.scale, kernels.i64(self.groups)))


def quantized_shape(shape, last_padded: int, transpose: bool = False) -> Tuple[int, ...]:
    shape = tuple(shape)
    if transpose:
        return shape[:-2] + (shape[-1], last_padded)
    return shape[:-1] + (last_padded,)


# -- int32 (fp32) accumulators -> output ---------------------------------------------------------------
def quantized_epilogue(fmt: QuantFormat, out_dtype: str, has_bias: bool, residual_dtype: Optional[str], activation,
                       dual: bool = False, acc_dtype: str = "int32", residual_scaled: bool = False):
    """ElementwiseKernel: y = act(acc * dq + bias + res) rounded to fp16, stored as `out_dtype` (`fmt`'s storage:
    requantized with the output's scale, ``sy``); `dual` also stores it requantized with scale ``sq`` in
    ``yq``. With `residual_scaled` the residual has the scale ``rs``: a quantized residual is dequantized, a
    float one rounded to its quantized grid (int8: clamp(rint(res / rs), -127, 127) * rs). Call as kernel(acc,
    dq[, bias][, res][, rs][, sy][, sq], y[, yq]); `acc` int32 (float32 for FP8)."""
    params, e = [f"{acc_dtype} acc", "float32 dq"], "((float)acc * dq)"
    if has_bias:
        params.append("float32 bias")
        e = f"({e} + bias)"
    if residual_dtype:
        params.append(f"{residual_dtype} res")
        r = "(float)res"
        if residual_scaled:
            params.append("float32 rs")
            r = "(tt_v(res) * rs)" if residual_dtype == fmt.storage else f"(tt_v(tt_q({r}, rs)) * rs)"
        e = f"({e} + {r})"
    e = activation_expr(e, activation)
    outs = f"{out_dtype} y"
    if out_dtype == fmt.storage:
        params.append("float32 sy")
        body = f"float v = tt_fp16({e}); y = tt_q(v, sy);"
    else:
        body = f"float v = {e}; y = ({C_TYPE[out_dtype]})(v);"
    if dual:
        params.append("float32 sq")
        outs += f", {fmt.storage} yq"
        body += " yq = tt_q(tt_fp16(v), sq);"
    return kernels.elementwise(", ".join(params), outs, body, f"tt_{acc_dtype}_epilogue", PREAMBLE + _FP16 + fmt.qfunc)


#: Round a float to the nearest fp16 value (cupy's float16 type exists only in kernels with fp16 arguments).
_FP16 = r"""
__device__ __forceinline__ float tt_fp16(float f) {
  unsigned short h; float r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
  return r;
}
"""


@dataclasses.dataclass
class Dequant:
    """What turns int32 (FP8: fp32) accumulators into the output: per-channel dq, bias, activation, output scale."""

    dq: object          # cupy float32 [Cout] (matrix multiplies with a constant A: [M, N])
    bias: object        # cupy float32 [Cout] or None
    activation: Optional[dict]
    out_dtype: str
    out_scale: Optional[np.float32]
    residual_dtype: Optional[str]
    #: Also write the output requantized with this scale (a second, quantized output).
    dual_scale: Optional[np.float32] = None
    acc_dtype: str = "int32"
    #: The residual's scale (a quantized convolution's quantized residual, see program.quantized_residual).
    res_scale: Optional[np.float32] = None
    fmt: QuantFormat = INT8

    def __post_init__(self):
        self.kernel = quantized_epilogue(self.fmt, self.out_dtype, self.bias is not None, self.residual_dtype,
                                         self.activation, self.dual_scale is not None, self.acc_dtype,
                                         self.res_scale is not None)

    @property
    def requant_scale(self) -> Optional[np.float32]:
        """The scale of the quantized values this layer writes (its quantized output or its second output)."""
        return self.out_scale if self.out_dtype == self.fmt.storage else self.dual_scale

    def run(self, acc, res, y, yq=None) -> None:
        args = [acc, self.dq] + ([self.bias] if self.bias is not None else []) + ([res] if res is not None else [])
        if res is not None and self.res_scale is not None:
            args.append(self.res_scale)
        if self.out_dtype == self.fmt.storage:
            args.append(self.out_scale)
        if self.dual_scale is not None:
            args.append(self.dual_scale)
        self.kernel(*args, y, *([yq] if self.dual_scale is not None else []))

    @property
    def nbytes(self) -> int:
        return int(self.dq.nbytes) + (int(self.bias.nbytes) if self.bias is not None else 0)


def out_scale(spec: Spec, fmt: QuantFormat) -> Optional[np.float32]:
    """The scale of a layer's quantized output (None for a float one)."""
    if spec.out_dtypes[0] != fmt.storage:
        return None
    return fmt.scale(spec.layer.outputs[0].dynamic_range)


# -- cuDNN int8 convolution ---------------------------------------------------------------------------
#: Graph variants, most fused first: "fused" dequantizes, adds bias and residual, activates (and rounds
#: to fp16 and requantizes) inside cuDNN; "fused_i32" is the same with the accumulator typed int32;
#: "fused_nr" (int8 outputs only) requantizes without the fp16 rounding (about 0.2% of the int8 values
#: then differ by one step from the numpy backend's); "conv" writes the int32 accumulators and an
#: epilogue kernel does the rest. With a second (int8) output, "fused+q" and "fused_nr+q" write both
#: from the graph, and the single-output graphs are followed by a quantize kernel.
INT8_FUSIONS = ("fused", "fused_i32", "fused_nr", "conv")
DUAL_FUSIONS = ("fused+q", "fused_nr+q")


class CudnnInt8ConvGraph(CudnnConvGraph):
    """A cuDNN int8 convolution graph (NHWC, int8 image and filter, int32 accumulation)."""

    def __init__(self, geom: ConvGeom, fusion: str, bias: bool, residual: Optional[Tuple[int, str]], activation,
                 out_dtype: str, max_workspace: int, handle, fp8: bool = False):
        import threading

        dual = fusion.endswith("+q")
        cudnn = _device.cudnn_module()
        dt = cudnn.data_type
        qt, acc = (dt.FP8_E4M3, dt.FLOAT) if fp8 else (dt.INT8, dt.INT32)  # FP8: E4M3 operands, fp32 sums
        self.lock = threading.Lock()
        self.fusion, self.dtype = fusion, out_dtype
        io = {"float16": dt.HALF, "float32": dt.FLOAT, "int8": dt.INT8}
        g2 = geom.as2d()
        inter = acc if fusion == "conv" else dt.FLOAT
        g = cudnn.pygraph(io_data_type=qt, intermediate_data_type=inter, compute_data_type=inter, handle=handle)
        xd, xs = nhwc_dims(g2.n, g2.c, g2.spatial)
        wd, ws = nhwc_dims(g2.cout, g2.cg, g2.kernel)
        vd, vs = nhwc_dims(1, g2.cout, [1] * len(g2.spatial))
        self.X = g.tensor(name="X", dim=xd, stride=xs, data_type=qt)
        self.W = g.tensor(name="W", dim=wd, stride=ws, data_type=qt)
        y = g.conv_fprop(image=self.X, weight=self.W, pre_padding=list(g2.pre), post_padding=list(g2.post),
                         stride=list(g2.strides), dilation=list(g2.dilations), compute_data_type=acc,
                         name="conv")
        self.S = self.B = self.R = self.Q = self.H = self.Yq = None
        yd, ys = nhwc_dims(g2.n, g2.cout, g2.out)
        if fusion == "conv":
            y = g.identity(input=y, name="identity", compute_data_type=acc)
            y.set_output(True).set_data_type(acc).set_dim(yd).set_stride(ys)
        else:
            if fusion == "fused_i32":
                y.set_data_type(dt.INT32)
            f32 = dt.FLOAT
            self.S = g.tensor(name="S", dim=vd, stride=vs, data_type=f32)
            y = g.mul(a=y, b=self.S, name="dequant", compute_data_type=f32)
            if bias:
                self.B = g.tensor(name="B", dim=vd, stride=vs, data_type=f32)
                y = g.add(a=y, b=self.B, name="bias", compute_data_type=f32)
            if residual is not None:
                rn, rdtype = residual
                rd, rs = nhwc_dims(rn, g2.cout, g2.out)
                self.R = g.tensor(name="R", dim=rd, stride=rs, data_type=io[rdtype])
                y = g.add(a=y, b=self.R, name="residual", compute_data_type=f32)
            if activation:
                y = _cudnn_activation(g, y, activation)
            if out_dtype == "int8" or dual:  # q = clamp(floor(fp16(y) / s + 0.5), -127, 127): integers, then int8
                q = y
                if not fusion.startswith("fused_nr"):
                    q = g.identity(input=q, name="fp16", compute_data_type=f32)
                    q.set_data_type(dt.HALF)
                self.Q = g.tensor(name="Q", dim=vd, stride=vs, data_type=f32)
                self.H = g.tensor(name="H", dim=vd, stride=vs, data_type=f32)
                q = g.mul(a=q, b=self.Q, name="requant", compute_data_type=f32)
                q = g.add(a=q, b=self.H, name="half", compute_data_type=f32)
                q = g.floor(input=q, name="round", compute_data_type=f32)
                q = g.relu(input=q, lower_clip=-float(QMAX), upper_clip=float(QMAX), name="clamp",
                           compute_data_type=f32)
                if dual:
                    q.set_output(True).set_data_type(dt.INT8).set_dim(yd).set_stride(ys)
                    self.Yq = q
                else:
                    y = q
            y.set_output(True).set_data_type(io[out_dtype]).set_dim(yd).set_stride(ys)
        self.Y = y
        g.validate()
        g.build_operation_graph()
        notes = [getattr(cudnn.behavior_note, n) for n in ("REQUIRES_FILTER_INT8x32_REORDER",
                                                           "REQUIRES_BIAS_INT8x32_REORDER")
                 if hasattr(cudnn.behavior_note, n)]
        if notes:
            g.deselect_behavior_notes(notes)
        g.deselect_workspace_greater_than(int(max_workspace))
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        self.graph = g
        self.built = {}
        self.failed = set()


class CudnnInt8ConvOp(Op):
    """One plan of a cuDNN int8 convolution graph; with fusion "conv" an epilogue kernel dequantizes."""

    uses_cudnn = True

    def __init__(self, graph: CudnnInt8ConvGraph, plan, w, deq: Dequant, acc_shape, has_residual: bool):
        self.graph, (self.index, name, self.plan_workspace) = graph, plan
        self.w, self.deq, self.has_residual = w, deq, has_residual
        self.acc_shape = acc_shape
        self.acc_bytes = align(int(np.prod(acc_shape)) * 4) if graph.fusion == "conv" else 0
        self.workspace = self.acc_bytes + self.plan_workspace
        cupy = _device.require()
        self.q = self.half = None
        if graph.Q is not None:
            cout = int(deq.dq.shape[-1])
            self.q = cupy.full((cout,), np.float32(1.0) / deq.requant_scale, cupy.float32)
            self.half = cupy.full((cout,), 0.5, cupy.float32)
        self.device_bytes = int(w.nbytes) + deq.nbytes
        self.tactic = {"op": "cudnn_conv_int8", "fusion": graph.fusion, "plan": name, "workspace": self.workspace}

    def run(self, rc, ins, outs):
        g = self.graph
        ws_ptr = rc.workspace_ptr + self.acc_bytes
        pack = {g.X: ins[0].data.ptr, g.W: self.w.data.ptr}
        if g.fusion == "conv":
            acc = rc.scratch(0, self.acc_shape, self.deq.acc_dtype)
            pack[g.Y] = acc.data.ptr
        else:
            pack[g.Y] = outs[0].data.ptr
            pack[g.S] = self.deq.dq.data.ptr
            if g.B is not None:
                pack[g.B] = self.deq.bias.data.ptr
            if g.R is not None:
                pack[g.R] = ins[1].data.ptr
            if g.Q is not None:
                pack[g.Q] = self.q.data.ptr
                pack[g.H] = self.half.data.ptr
            if g.Yq is not None:
                pack[g.Yq] = outs[1].data.ptr
        g.execute(self.index, pack, ws_ptr if self.plan_workspace else None, rc.cudnn)
        if g.fusion == "conv":
            self.deq.run(acc, ins[1] if self.has_residual else None, outs[0], outs[1] if len(outs) > 1 else None)


class QuantizeAfterOp(Op):
    """A single-output convolution, then its output quantized into the second output (dual layers)."""

    def __init__(self, inner: Op, quantize: "QuantizeOp"):
        self.inner, self.quantize = inner, quantize
        self.workspace, self.device_bytes = inner.workspace, inner.device_bytes
        self.tactic = dict(inner.tactic, dual="kernel")

    def run(self, rc, ins, outs):
        self.inner.run(rc, ins, outs[:1])
        self.quantize.run(rc, outs[:1], outs[1:])


def _cudnn_int8_graph(geom, fusion, bias, residual, activation, out_dtype, opts, fp8: bool = False
                      ) -> CudnnInt8ConvGraph:
    import json

    key = json.dumps(["fp8" if fp8 else "int8", dataclasses.astuple(geom), fusion, bias, residual, activation,
                      out_dtype, opts.max_workspace, _device.device_name()], sort_keys=True, default=str)
    return cudnn_graph_cache(key, lambda: CudnnInt8ConvGraph(geom, fusion, bias, residual, activation, out_dtype,
                                                             opts.max_workspace, opts.tuner.cudnn, fp8))


# -- cuBLAS int8 GEMM convolution ---------------------------------------------------------------------
class GemmInt8ConvOp(Op):
    """int8 im2col (skipped for 1x1/stride-1/unpadded) + one cuBLAS int8 GEMM (int32 out) + epilogue.
    The im2col moves 4 channels (one 32-bit word) per thread: quantized channels are a multiple of 4."""

    def __init__(self, geom: ConvGeom, w_nk, deq: Dequant, has_residual: bool):
        self.geom, self.w, self.deq, self.has_residual = geom, w_nk, deq, has_residual
        self.direct = geom.pointwise_gemm()
        self.kdim = geom.ksize * geom.c
        self.np = padded(geom.cout)
        self.cols_bytes = 0 if self.direct else align(geom.rows * self.kdim)
        self.acc_bytes = align(geom.rows * self.np * 4)
        self.workspace = self.cols_bytes + self.acc_bytes
        self.im2col = None if self.direct else im2col_kernel(dataclasses.replace(geom, c=geom.c // 4), 4)
        self.device_bytes = int(w_nk.nbytes) + deq.nbytes
        self.tactic = {"op": "gemm_conv_int8", "im2col": not self.direct, "workspace": self.workspace}

    def run(self, rc, ins, outs):
        g = self.geom
        x = ins[0]
        if self.direct:
            a = x.data.ptr
        else:
            total = g.rows * self.kdim // 4
            kernels.launch(self.im2col, total, (x, rc.workspace, kernels.i64(total)))
            a = rc.workspace_ptr
        acc = rc.scratch(self.cols_bytes, (g.rows, self.np), "int32")
        rc.cublas.gemm("int8", g.rows, g.cout, self.kdim, a, self.kdim, False, self.w.data.ptr, self.kdim, True,
                       acc.data.ptr, self.np, out_dtype="int32")
        acc = acc.reshape(outs[0].shape[:-1] + (self.np,))[..., :g.cout]
        self.deq.run(acc, ins[1] if self.has_residual else None, outs[0], outs[1] if len(outs) > 1 else None)


def _conv_weights(kernel: np.ndarray, cp: int) -> Tuple[np.ndarray, np.ndarray]:
    """int8 weights [Cout, *K, cp] (input channels zero-padded) and the per-output-channel scales."""
    q, s = quantize_weights(kernel, axis=-1)
    if cp > kernel.shape[-2]:
        q = np.concatenate([q, np.zeros(q.shape[:-2] + (cp - q.shape[-2], q.shape[-1]), np.int8)], axis=-2)
    return np.ascontiguousarray(np.moveaxis(q, -1, 0)), s


def int8_conv_candidates(spec: Spec) -> List[Op]:
    """cuDNN int8 plans of the most fused graph that has any, our Triton kernel (triton_conv.py) and the cuBLAS
    int8 GEMM path (FP8 layers: fp8.py's)."""
    from tftrt_py.engine.backends.cupy.ops.triton_conv import triton_conv_candidates

    if spec.quant.get("format") == "FP8":
        from tftrt_py.engine.backends.cupy.ops.fp8 import fp8_conv_candidates

        return fp8_conv_candidates(spec)
    cupy = _device.require()
    layer, opts, quant = spec.layer, spec.options, spec.quant
    geom = ConvGeom.of(layer, spec.in_shapes[0], spec.out_shapes[0])  # c is the padded channel count
    if geom.groups != 1:
        return []
    activation = layer.params.get("activation")
    has_residual = len(spec.in_shapes) > 1
    residual = (spec.in_shapes[1][0], spec.in_dtypes[1]) if has_residual else None
    w_q, s_w = _conv_weights(layer.weights["kernel"], geom.c)
    dq = cupy.asarray((np.float32(quant["in_scale"]) * s_w).astype(np.float32))
    bias = layer.weights.get("bias")
    bias32 = cupy.asarray(bias.astype(np.float32)) if bias is not None else None
    out_dtype = spec.out_dtypes[0]
    dual, res_scale = quant.get("dual_scale"), quant.get("res_scale")
    deq = Dequant(dq, bias32, activation, out_dtype, out_scale(spec, INT8), residual[1] if residual else None,
                  np.float32(dual) if dual is not None else None,
                  res_scale=np.float32(res_scale) if has_residual and res_scale is not None else None)
    w = cupy.asarray(w_q)
    prefer = spec.prefer or {}
    force = os.environ.get("TFTRT_PY_INT8_CONV")  # tests: only this path ("gemm", "triton" or one of the fusions)
    cands: List[Op] = []
    if (_device.cudnn_module() is not None and prefer.get("op") in (None, "cudnn_conv_int8") and force != "gemm"
            and deq.res_scale is None):  # cuDNN's graphs here take a float residual as it is
        families = set()  # with a second output: the first dual graph with plans, and the first single one
        for fusion in (DUAL_FUSIONS if dual is not None else ()) + INT8_FUSIONS:
            family = "dual" if (fusion.endswith("+q") or (fusion == "conv" and dual is not None)) else "single"
            if family in families or prefer.get("fusion") not in (None, fusion) or force not in (None, fusion):
                continue
            if fusion != "conv" and residual is not None and residual[0] != geom.n:
                continue  # a residual broadcast over the batch stays out of the graph (see conv._fusions)
            if fusion == "fused_nr" and out_dtype != "int8":
                continue
            try:
                graph = _cudnn_int8_graph(geom, fusion, bias is not None, residual, activation, out_dtype, opts)
                plans = graph.plans(opts.cudnn_plans, prefer.get("plan"), opts.cudnn_runtime_plans)
            except Exception as exc:
                logger.debug("cuDNN int8 graph (%s) for %s not supported: %s", fusion, layer.name, exc)
                continue
            if plans:
                families.add(family)
                acc_shape = (geom.n, *geom.out, geom.cout)
                ops = [CudnnInt8ConvOp(graph, plan, w, deq, acc_shape, has_residual) for plan in plans]
                if dual is not None and family == "single":
                    quantize = QuantizeOp(spec.out_shapes[0], out_dtype, dual, geom.cout)
                    ops = [QuantizeAfterOp(op, quantize) for op in ops]
                cands += ops
    if prefer.get("op") in (None, "triton_conv_int8") and force in (None, "triton"):
        cands += triton_conv_candidates("INT8", geom, w, deq, residual, prefer)
    want_gemm = (prefer.get("op") == "gemm_conv_int8" or (not prefer and (geom.pointwise_gemm() or geom.c < PAD))
                 or not cands)
    if want_gemm and force in (None, "gemm"):
        w_nk = cupy.asarray(np.ascontiguousarray(w_q.reshape(geom.cout, -1)))  # [Cout, K]: K-contiguous
        cands.append(GemmInt8ConvOp(geom, w_nk, deq, has_residual))
    return cands


# -- cuBLAS int8 matrix multiply -------------------------------------------------------------------------
def matmul_dequant(spec: Spec, fmt: QuantFormat = INT8, acc_dtype: str = "int32") -> Dequant:
    """A quantized MatrixMultiply's epilogue: dq [N] (or [M, N] for a constant A), bias, activation, output scale."""
    cupy = _device.require()
    n = spec.out_shapes[0][-1]
    bias = spec.weights.get("bias")
    bias32 = cupy.asarray(np.broadcast_to(bias.astype(np.float32), (n,)).copy()) if bias is not None else None
    dq = cupy.asarray(np.ascontiguousarray(spec.quant["dq"], np.float32))
    return Dequant(dq, bias32, spec.params.get("activation"), spec.out_dtypes[0], out_scale(spec, fmt), None,
                   acc_dtype=acc_dtype, fmt=fmt)


class Int8MatMulOp(Op):
    """Batched int8 GEMM C[b] = A[b] B[b] with A [.., M, Kp] and B as [.., N, Kp] (both K-contiguous),
    int32 accumulators in the workspace, then the epilogue. Constant operands are uploaded quantized;
    activation operands arrive quantized (and transposed where needed) from QuantizeOp steps."""

    #: The accumulators' dtype, and the operands' format.
    ACC, FORMAT = "int32", INT8

    def __init__(self, spec: Spec):
        cupy = _device.require()
        q = spec.quant
        out = spec.out_shapes[0]
        self.m, self.n = out[-2], out[-1]
        batch = tuple(out[:-2])
        self.batch = int(np.prod(batch)) if batch else 1
        self.kp = q["kp"]
        ins = iter(range(len(spec.in_shapes)))
        self.sources, self.strides = [], []
        for role, rows in (("a", self.m), ("b", self.n)):
            info = q[role]
            if info["const"] is not None:
                arr = cupy.asarray(info["const"])  # [batch' or 1, rows, Kp] int8
                self.sources.append(("const", arr))
                size = int(np.prod(arr.shape[:-2])) if arr.ndim > 2 else 1
            else:
                i = next(ins)
                self.sources.append(("input", i))
                shape = spec.in_shapes[i]
                size = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
            if size == 1:
                self.strides.append(0)
            elif size == self.batch:
                self.strides.append(rows * self.kp)
            else:
                raise ValueError(f"int8 MatrixMultiply {spec.layer.name!r}: an operand's batch dims only partly "
                                 f"broadcast ({size} of {self.batch})")
        self.np = padded(self.n, 4)
        self.workspace = align(self.batch * self.m * self.np * 4)
        self.deq = matmul_dequant(spec, self.FORMAT, self.ACC)
        self.device_bytes = self.deq.nbytes + sum(int(s[1].nbytes) for s in self.sources if s[0] == "const")
        self.tactic = {"op": "cublas_gemm_int8", "workspace": self.workspace}

    def _ptr(self, source, ins) -> int:
        kind, v = source
        return v.data.ptr if kind == "const" else ins[v].data.ptr

    def run(self, rc, ins, outs):
        acc = rc.scratch(0, (self.batch, self.m, self.np), self.ACC)
        self._gemm(rc, self._ptr(self.sources[0], ins), self._ptr(self.sources[1], ins), acc.data.ptr)
        self.deq.run(acc[:, :, :self.n], None, outs[0].reshape(self.batch, self.m, self.n))

    def _gemm(self, rc, a: int, b: int, acc: int) -> None:
        rc.cublas.gemm("int8", self.m, self.n, self.kp, a, self.kp, False, b, self.kp, True, acc, self.np,
                       batch=self.batch, stride_a=self.strides[0], stride_b=self.strides[1],
                       stride_c=self.m * self.np, out_dtype="int32")


class LtInt8MatMulOp(Int8MatMulOp):
    """The same int8 GEMM (int32 accumulators) through one cuBLASLt algorithm."""

    #: cuBLASLt's operand dtype.
    OPERANDS = "int8"

    def __init__(self, spec: Spec, algo: int, plan=None):
        from tftrt_py.engine.backends.cupy import cublaslt
        from tftrt_py.engine.backends.cupy.context import CUBLAS_WORKSPACE

        super().__init__(spec)
        self.plan = plan or cublaslt.LtGemm(
            self.m, self.n, self.kp, self.OPERANDS, out_dtype=self.ACC, trans_b=True, lda=self.kp, ldb=self.kp, ldd=self.np,
            batch=self.batch, stride_a=self.strides[0], stride_b=self.strides[1], stride_d=self.m * self.np,
            max_workspace=CUBLAS_WORKSPACE, algos=2)
        self.algo = algo
        self.tactic = {"op": f"cublaslt_gemm_{'int8' if self.OPERANDS == 'int8' else 'fp8'}", "plan": algo,
                       "workspace": self.workspace}

    def _gemm(self, rc, a: int, b: int, acc: int) -> None:
        ws = rc.cublas
        self.plan.run(self.algo, a, b, acc, ws.workspace_ptr, ws.workspace_bytes, rc.stream.ptr)


def int8_matmul_candidates(spec: Spec) -> List[Op]:
    """Our Triton kernel's GEMMs (triton_conv.triton_matmul_candidates), the cuBLAS int8 GEMM and cuBLASLt's first
    algorithms (see matmul.gemm_paths); FP8 layers: fp8.py's."""
    from tftrt_py.engine.backends.cupy.ops.matmul import gemm_paths
    from tftrt_py.engine.backends.cupy.ops.triton_conv import triton_matmul_candidates

    if spec.quant.get("format") == "FP8":
        from tftrt_py.engine.backends.cupy.ops.fp8 import fp8_matmul_candidates

        return fp8_matmul_candidates(spec)
    want_cublas, want_lt = gemm_paths(spec.prefer, "cublas_gemm_int8", "cublaslt_gemm_int8")
    lt: List[Op] = []
    if want_lt:
        try:
            first = LtInt8MatMulOp(spec, 0)
            lt = [first] + [LtInt8MatMulOp(spec, i, first.plan) for i in range(1, len(first.plan.algos))]
            want = (spec.prefer or {}).get("plan")
            lt = [op for op in lt if want in (None, op.algo)]
        except Exception as exc:
            logger.debug("no cuBLASLt int8 candidate for %s: %s", spec.layer.name, exc)
    own = triton_matmul_candidates("INT8", spec, matmul_dequant(spec))
    return ([Int8MatMulOp(spec)] if want_cublas or not (lt or own) else []) + lt + own


def matmul_constant(value: np.ndarray, role: str, transposed: bool, kp: int):
    """A constant matmul operand quantized for the GEMM: ([.., rows, kp] int8, float32 scale per row).

    `role` "a": rows are M (stored [.., M, K], or [.., K, M] when `transposed`); "b": rows are N (stored
    [.., K, N], or [.., N, K] when `transposed`): one scale per output row or column.
    """
    v = np.asarray(value, np.float32)
    k_last = (role == "a") != transposed  # is K the last stored axis?
    rows_k = v if k_last else np.swapaxes(v, -1, -2)  # [.., rows, K]
    q, s = quantize_weights(rows_k, axis=-2)
    pad = kp - q.shape[-1]
    if pad:
        q = np.concatenate([q, np.zeros(q.shape[:-1] + (pad,), np.int8)], axis=-1)
    return np.ascontiguousarray(q), s
