"""Quantized operands on the cupy backend: how INT8 and FP8 store them (:class:`DeviceFormat`), the quantize step
that writes them and the epilogue that dequantizes int32 (FP8: fp32) accumulators.

The contract (engine/quantization.py; numpy_precision.py computes the same on the CPU): an activation operand is
quantized with its tensor's symmetric scale s_x = dynamic_range / qmax (127, or 448 for E4M3),
``q = round(x / s_x)`` (int8: half to even, clamped to [-127, 127]; E4M3: nearest even, saturated); a constant
operand (weights) per output channel; ``y = act(acc * s_x * s_w[c] + bias + residual)`` in fp32, rounded to fp16
(also before an output is requantized).

Quantizing is a step of its own (:class:`QuantizeOp`, shared by every quantized reader of a tensor, with channels
zero-padded to a multiple of 16); a tensor that only quantized layers read is written quantized directly by its
producer (``out_scale``), so it never exists in float; a convolution output that quantized layers and others (a
residual sum) read is written twice by its producer, in fp16 and quantized (``dual_scale``).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Tuple

import numpy as np

from tftrt_py.engine import quantization
from tftrt_py.engine.backends.cupy import _device, kernels
from tftrt_py.engine.backends.cupy.ops.base import FollowedOp, Op, Spec
from tftrt_py.engine.backends.cupy.ops.conv_fold import NAN_PIXEL, folded_shape
from tftrt_py.engine.backends.cupy.ops.pointwise import C_TYPE, PREAMBLE, activation_expr

__all__ = ["PAD", "padded", "conv_channels", "INT8_Q", "E4M3_Q", "DeviceFormat", "INT8", "FP8", "FORMATS", "ROWS",
           "TRANSPOSED", "FOLDED", "QuantizeOp", "operand_quantize", "QuantizeAfterOp", "quantized_shape",
           "quantized_epilogue", "Dequant", "out_scale", "matmul_dequant"]

#: Quantized operands have their reduction (channel) dim zero-padded to a multiple of this.
PAD = 16


def padded(n: int, to: int = PAD) -> int:
    return -(-int(n) // to) * to


def conv_channels(c: int) -> int:
    """Channels of a convolution's quantized input: a multiple of 16, or of 4 below 16 (an RGB image
    becomes 4 channels: 4 bytes a pixel, which the GEMM path's im2col moves as one word)."""
    return padded(c, 4) if c < PAD else padded(c)


# -- device rounding ---------------------------------------------------------------------------------
#: tt_q(v, s): the quantized byte of v with scale s (in the low 8 bits); tt_v(q): the value of byte q (before
#: its scale). The int8 one clamps, then rounds to nearest even by adding 1.5 * 2**23 (the sum's low bits are the
#: integer): rintf and the float-to-int conversion run at a quarter of the rate of adds, and a quantize step is
#: bound by its instructions (a [4096, 768] fp16 tensor: 5.3 us, FP8's step 4.0).
INT8_Q = r"""
__device__ __forceinline__ int tt_q(float v, float s) {
  if (!(s > 0.0f)) return 0;
  return __float_as_int(fminf(fmaxf(v / s, -127.0f), 127.0f) + 12582912.0f) - 0x4B400000;
}
__device__ __forceinline__ float tt_v(int q) { return (float)(signed char)q; }
"""

#: The E4M3FN byte of v / s (nearest even, saturated, NaN kept), and the value of an E4M3FN byte.
E4M3_Q = r"""
__device__ __forceinline__ int tt_q(float v, float s) {
  unsigned short h;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(0.0f), "f"(v / s));
  return h & 0xff;
}
__device__ __forceinline__ float tt_v(int q) {
  unsigned int h2; float f;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((unsigned short)(q & 0xff)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)(h2 & 0xffff)));
  return f;
}
"""


@dataclasses.dataclass(frozen=True)
class DeviceFormat:
    """How a quantized precision stores its operands here: its rules (engine/quantization.py's QuantFormat: the
    largest magnitude a tensor's range maps to), storage dtype, the device functions tt_q/tt_v that round to and
    read its bytes, the padding of a convolution's input channels, whether its bytes hold NaN (E4M3 keeps it;
    int8 has none, its clamp takes NaN to -127)."""

    name: str
    storage: str
    rules: quantization.QuantFormat
    qfunc: str
    channels: Callable[[int], int]
    keeps_nan: bool

    @property
    def qmax(self) -> float:
        return self.rules.qmax

    def scale(self, dynamic_range: float) -> np.float32:
        """The symmetric per-tensor scale of a tensor with this dynamic range (1 for an empty range)."""
        return np.float32(quantization.scale(dynamic_range, self.qmax))


INT8 = DeviceFormat("INT8", "int8", quantization.FORMATS["INT8"], INT8_Q, conv_channels, keeps_nan=False)
#: E4M3 bytes are stored as uint8 (cupy has no float8 type).
FP8 = DeviceFormat("FP8", "uint8", quantization.FORMATS["FP8"], E4M3_Q, conv_channels, keeps_nan=True)
#: How each quantized precision stores its operands here, by precision name.
FORMATS = {"INT8": INT8, "FP8": FP8}


# -- quantize step -----------------------------------------------------------------------------------
_QUANTIZE = kernels.source("quantize.cu")


def _vector(dtype: str, d2: int, d2p: int, transpose: bool, rows: int, d1: int, fold_h: int) -> int:
    """Values a thread of the quantize kernel reads in one load where fp16 rows are read as they are (8 or 4 halves),
    16 where four float32 pixels of 3 channels become 4 bytes each (an image for a stem: 38.5 million pixels for
    ResNet-50 at batch 128, where element by element the step took twice its DRAM time on an H200), 32 where it is
    folded (four pixels of each of two rows: two folded pixels), else 1 (element by element, 4 a thread)."""
    if dtype == "float32" and (d2, d2p) == (3, 4) and not transpose and rows % 4 == 0 and (not fold_h or d1 % 4 == 0):
        return 32 if fold_h else 16
    if dtype != "float16" or transpose or d2 != d2p:
        return 1
    return 8 if d2 % 8 == 0 else 4


def quantize_kernel(dtype: str, outer: int, d1: int, d2: int, d2p: int, transpose: bool, qfunc: str = INT8_Q,
                    fold_h: int = 0, flag_nan: bool = False):
    """The quantize kernel of x [OUTER, D1, D2] (or [OUTER, D2, D1] transposed); `fold_h`: the image height H where
    x [N * H, W, 4] is written folded by 2x2 pixel blocks (else 0); `flag_nan`: pixels holding NaN are written as
    a flag in their padding byte (quantize.cu's NAN_FLAG)."""
    vec = _vector(dtype, d2, d2p, transpose, outer * d1, d1, fold_h)
    head = (f"#define T {kernels.raw_type(dtype)}\n#define D1 {d1}\n#define D2 {d2}\n#define D2P {d2p}\n"
            f"#define TRANSPOSE {int(transpose)}\n#define VEC4 {int(vec == 4)}\n#define VEC8 {int(vec == 8)}\n"
            f"#define RGB4 {int(vec >= 16)}\n#define FOLD_H {fold_h}\n#define NAN_FLAG {int(flag_nan)}\n"
            f"#define NAN_PIXEL {NAN_PIXEL:#x}\n")
    return kernels.raw_kernel(head + qfunc + _QUANTIZE, "tt_quantize")


#: How a quantize step lays out its operand: as it is (channels last, padded), its last two dims swapped (a
#: [.., K, N] operand becomes K-contiguous [.., N, K]), or an NHWC image of 4 padded channels folded by 2x2 pixel
#: blocks into [N, H/2, W/2, 16] (the stem convolutions ops/conv_fold.py folds).
ROWS, TRANSPOSED, FOLDED = "rows", "transposed", "folded"


class QuantizeOp(Op):
    """x (float) -> int8 with scale `s`; the last dim zero-padded to `last_padded`, laid out as `layout` says (ROWS,
    TRANSPOSED or FOLDED). `qfunc`: the rounding (INT8_Q, or E4M3_Q: E4M3 bytes). `flag_nan` (a FOLDED image of
    fewer than 4 channels): each pixel holding NaN is written as a flag in its padding byte, its channels 0, for the
    folded convolution's NaN-window step (ops/conv_fold.py says why)."""

    def __init__(self, shape, dtype: str, scale: float, last_padded: int, layout: str = ROWS,
                 qfunc: str = INT8_Q, flag_nan: bool = False):
        shape = tuple(int(d) for d in shape)
        transpose = layout == TRANSPOSED
        if transpose:
            d2, d1 = shape[-2], shape[-1]
            outer = int(np.prod(shape[:-2], dtype=np.int64))
        else:
            d1, d2 = (shape[-2] if len(shape) > 1 else 1), shape[-1]
            outer = int(np.prod(shape[:-2], dtype=np.int64)) if len(shape) > 1 else 1
        fold_h = shape[1] if layout == FOLDED else 0
        if fold_h and (len(shape) != 4 or last_padded != 4 or shape[1] % 2 or shape[2] % 2):
            raise ValueError(f"only NHWC images of even height and width padded to 4 channels fold, not {shape}")
        if flag_nan and not (fold_h and d2 < last_padded):
            raise ValueError(f"NaN pixels are flagged in the padding byte of a folded image: {shape} has none")
        self.scale = np.float32(scale)
        vec = _vector(dtype, d2, last_padded, transpose, outer * d1, d1, fold_h)
        self.groups = outer * d1 * last_padded // max(4, vec)
        self.kernel = quantize_kernel(dtype, outer, d1, d2, last_padded, transpose, qfunc, fold_h, flag_nan)
        self.tactic = {"op": "quantize", "scale": float(self.scale), "layout": layout}
        if flag_nan:
            self.tactic["nan_flags"] = True

    def run(self, rc, ins, outs):
        kernels.launch(self.kernel, self.groups, (ins[0], outs[0], self.scale, kernels.i64(self.groups)))


def operand_quantize(shape, dtype: str, scale: float, last_padded: int, layout: str, fmt: DeviceFormat
                     ) -> QuantizeOp:
    """The quantize step of a layer's operand in format `fmt` laid out as `layout` (a folded E4M3 image flags its NaN
    pixels for the convolution's NaN-window step, ops/conv_fold.py)."""
    return QuantizeOp(shape, dtype, scale, last_padded, layout, fmt.qfunc, flag_nan=layout == FOLDED and fmt.keeps_nan)


def quantized_shape(shape, last_padded: int, layout: str = ROWS) -> Tuple[int, ...]:
    shape = tuple(shape)
    if layout == TRANSPOSED:
        return shape[:-2] + (shape[-1], last_padded)
    if layout == FOLDED:
        return folded_shape(shape[:-1] + (last_padded,))
    return shape[:-1] + (last_padded,)


class QuantizeAfterOp(FollowedOp):
    """A single-output convolution, then its output quantized into the second output (dual layers)."""

    def __init__(self, inner: Op, quantize: QuantizeOp):
        super().__init__(inner)
        self.quantize = quantize
        self.tactic = dict(inner.tactic, dual="kernel")

    def run(self, rc, ins, outs):
        self.inner.run(rc, ins, outs[:1])
        self.quantize.run(rc, outs[:1], outs[1:])



# -- int32 (fp32) accumulators -> output ---------------------------------------------------------------
def quantized_epilogue(fmt: DeviceFormat, out_dtype: str, has_bias: bool, residual_dtype: Optional[str], activation,
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
    fmt: DeviceFormat = INT8

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


def out_scale(spec: Spec, fmt: DeviceFormat) -> Optional[np.float32]:
    """The scale of a layer's quantized output (None for a float one)."""
    if spec.out_dtypes[0] != fmt.storage:
        return None
    return fmt.scale(spec.layer.outputs[0].dynamic_range)


def matmul_dequant(spec: Spec, fmt: DeviceFormat = INT8, acc_dtype: str = "int32") -> Dequant:
    """A quantized MatrixMultiply's epilogue: dq [N] (or [M, N] for a constant A), bias, activation, output scale."""
    cupy = _device.require()
    n = spec.out_shapes[0][-1]
    bias = spec.weights.get("bias")
    bias32 = cupy.asarray(np.broadcast_to(bias.astype(np.float32), (n,)).copy()) if bias is not None else None
    dq = cupy.asarray(np.ascontiguousarray(spec.quant["dq"], np.float32))
    return Dequant(dq, bias32, spec.params.get("activation"), spec.out_dtypes[0], out_scale(spec, fmt), None,
                   acc_dtype=acc_dtype, fmt=fmt)
