"""INT8 Convolution and MatrixMultiply layers as QuantizeLinear/DequantizeLinear pairs around the op, quantized
as the numpy backend does (numpy_precision): activations symmetric per tensor (scale = dynamic range / 127),
constant weights per output channel.

ONNX Runtime runs DequantizeLinear -> MatMul as int8 (MatMulIntegerToFloat) and DequantizeLinear -> Conv ->
QuantizeLinear as QLinearConv, so a convolution whose output has a range and no residual or activation but
relu gets a QDQ pair on its output too (relu as the output's zero point -128 over [0, range]); other
convolutions compute their int8 operands' values in fp32. x86 CPUs without VNNI multiply u8 by s8 in pairs
that saturate int16, so there the operands int8 kernels read as weights keep 7 bits (ONNX Runtime's
reduce_range; :data:`WEIGHT_QMAX`). Values below -127.5 scales quantize to -128 here, to -127 on numpy.
"""
from __future__ import annotations

import platform
from typing import Callable, Dict

import numpy as np

from tftrt_py.engine.backends.numpy_precision import QMAX, _scale
from tftrt_py.engine.backends.onnxruntime import nn
from tftrt_py.engine.backends.onnxruntime.graph import Graph
from tftrt_py.engine.backends.onnxruntime.registry import weight
from tftrt_py.engine.errors import BackendError

__all__ = ["INT8_LOWERINGS", "WEIGHT_QMAX", "weight_qmax"]

#: Weight magnitudes u8 x s8 pairs of int16 sums take without saturating (2 * 255 * 63 < 2 ** 15).
REDUCED_QMAX = 63


def weight_qmax() -> int:
    """The largest int8 weight magnitude int8 kernels take exactly here: 63 on x86 without VNNI, else 127."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return QMAX
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return REDUCED_QMAX
    return QMAX if flags & {"avx512_vnni", "avx_vnni", "amx_int8"} else REDUCED_QMAX


WEIGHT_QMAX = weight_qmax()

#: layer kind -> lowering of its INT8 layers
INT8_LOWERINGS: Dict[str, Callable] = {}


def _int8(kind: str):
    def wrap(fn):
        INT8_LOWERINGS[kind] = fn
        return fn

    return wrap


def _input_scale(layer, i: int, qmax: int = QMAX) -> float:
    t = layer.inputs[i]
    if t.dynamic_range is None:
        raise BackendError(f"INT8 layer {layer.name!r}: its input {t.name!r} has no dynamic range")
    return _scale(t.dynamic_range) * QMAX / qmax


def _qdq(g: Graph, x: str, scale: float, zero: int = 0) -> str:
    s, z = g.scalar(scale, np.float32), g.scalar(zero, np.int8)
    return g.node("DequantizeLinear", [g.node("QuantizeLinear", [x, s, z]), s, z])


def _per_channel(w: np.ndarray, axis: int, qmax: int = QMAX):
    """(int8 values of w, scale per index of `axis`) for symmetric ranges [-qmax, qmax]."""
    axis = axis % w.ndim
    amax = np.max(np.abs(w.astype(np.float64)), axis=tuple(i for i in range(w.ndim) if i != axis), keepdims=True)
    scale = np.where(amax > 0, amax / qmax, 1.0)
    return np.clip(np.rint(w / scale), -qmax, qmax), scale


def _dequantized(g: Graph, q: np.ndarray, scale: np.ndarray, axis: int, dtype) -> str:
    zero = g.const(np.zeros(scale.size, dtype))
    return g.node("DequantizeLinear", [g.const(q, dtype), g.const(scale.reshape(-1), np.float32), zero],
                  axis=axis % q.ndim)


@_int8("Convolution")
def _convolution(g, layer, ins):
    nsp = layer.weights["kernel"].ndim - 2
    sx = _input_scale(layer, 0)
    x = _qdq(g, nn.to_channels_first(g, ins[0], nsp), sx)
    act, out_range = layer.params.get("activation"), layer.outputs[0].dynamic_range
    if len(ins) > 1 or act not in (None, {"type": "relu"}) or not out_range:
        q, sw = _per_channel(nn.onnx_kernel(layer), axis=0)
        bias = g.const(weight(layer, "bias"), np.float32) if "bias" in layer.weights else None
        y = nn.conv(g, layer, x, g.const((q * sw).astype(np.float32)), bias)  # the int8 weights' values
        return [nn.conv_epilogue(g, layer, y, ins)]
    q, sw = _per_channel(nn.onnx_kernel(layer), axis=0, qmax=WEIGHT_QMAX)
    sw = sw.reshape(-1)
    bias = None
    if "bias" in layer.weights:  # int32 in the sums' scale, as QDQ convolutions carry it
        sb = sx * sw
        bias = _dequantized(g, np.rint(weight(layer, "bias") / sb), sb, 0, np.int32)
    y = nn.conv(g, layer, x, _dequantized(g, q, sw, 0, np.int8), bias)
    if act:
        y = _qdq(g, g.node("Relu", [y]), float(out_range) / (2 * QMAX + 1), -QMAX - 1)
    else:
        y = _qdq(g, y, _scale(out_range))
    return [nn.to_channels_last(g, y, nsp)]


@_int8("MatrixMultiply")
def _matmul(g, layer, ins):
    """Constant operands int8 per output channel (rows of A, columns of B), the others quantized per tensor;
    B is the operand int8 kernels read as weights."""
    operands = []
    for i, (x, flag, axis) in enumerate(zip(ins, ("transpose_a", "transpose_b"), (-2, -1))):
        t = layer.inputs[i]
        qmax = WEIGHT_QMAX if i == 1 else QMAX
        if t.producer is not None and t.producer.kind == "Constant":
            w = weight(t.producer, "value")
            q, scale = _per_channel(np.swapaxes(w, -1, -2) if layer.params.get(flag) else w, axis, qmax)
            operands.append(_dequantized(g, q, scale, axis, np.int8))
        else:
            x = nn.swap_last(g, x, t.rank) if layer.params.get(flag) else x
            operands.append(_qdq(g, x, _input_scale(layer, i, qmax)))
    return [nn.matmul_epilogue(g, layer, g.node("MatMul", operands))]
